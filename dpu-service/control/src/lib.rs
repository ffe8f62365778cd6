//! Control plane of dpu-service.
//!
//! This crate owns what the service has been told to do: the validated
//! domain model ([`model`]), the rules that decide whether a change is
//! acceptable ([`validate`] for syntax, [`state`] for consistency), the
//! persisted store that makes accepted changes durable before they are
//! acknowledged and publishes them to the data plane and the NVMe-oF target
//! ([`store`]), the reports by which a call waits for a consumer to apply
//! its change ([`apply`]), counters ([`telemetry`]) and the `dpu.v1` gRPC
//! services ([`service`]).
//!
//! It does not touch packets or block devices: consumers subscribe to
//! [`store::StateHandle::subscribe`] (and report what they applied through
//! an [`apply::Reporter`]) and register [`telemetry::CounterSource`]s. It does not open sockets either; the
//! binary serves [`service::Api`] with tonic.
//!
//! Invariants: a request is fully validated before anything changes; a
//! refused request changes nothing, and neither does one whose change a
//! consumer reports it could not apply (the change is undone); no input
//! makes a handler panic.

#![forbid(unsafe_code)]

pub mod apply;
pub mod convert;
pub mod error;
pub mod model;
pub mod service;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod validate;

pub use error::ControlError;
