//! What the resources' commands share: [`Shown`], the output of a command;
//! [`Paging`] and [`all_pages`] for list commands; and small helpers for
//! update masks, deletions and reading files.

use std::path::PathBuf;

use dpu_client::ClientError;
use dpu_proto::pbjson_types::FieldMask;
use serde_json::Value;

use crate::Failure;

/// What a command prints: JSON for machines, text for people.
pub struct Shown {
    pub json: Value,
    pub text: String,
}

pub fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

pub fn read(path: &PathBuf) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| Failure::Other(format!("reading {}: {e}", path.display())))
}

/// Paging of a list command; every page is fetched either way.
#[derive(Debug, clap::Args)]
pub struct Paging {
    /// Items per request (0: the service's default).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub page_size: i32,
}

/// What a successful delete shows: an empty JSON object, or one line of text.
pub fn deleted(what: String) -> Shown {
    Shown {
        json: Value::Object(Default::default()),
        text: format!("deleted {what}\n"),
    }
}

pub fn mask(paths: &[&str]) -> Option<FieldMask> {
    Some(FieldMask {
        paths: paths.iter().map(|p| p.to_string()).collect(),
    })
}

/// Follows page tokens until the end, collecting every item.
pub async fn all_pages<T, F, Fut>(mut page: F) -> Result<Vec<T>, Failure>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, String), ClientError>>,
{
    let mut items = Vec::new();
    let mut token = String::new();
    loop {
        let (mut got, next) = page(token).await?;
        items.append(&mut got);
        if next.is_empty() {
            return Ok(items);
        }
        token = next;
    }
}
