//! Waiting for a consumer to apply a published state.
//!
//! The store numbers the states it publishes ([`crate::store::Published`]),
//! as the switch numbers the configurations it publishes. A consumer whose
//! effect a client must be able to rely on once its call returns (the
//! NVMe-oF target: after `DeleteNamespace` returns, no command reaches the
//! namespace and the I/O that was running on it has ended) follows the
//! store and reports, through its [`Reporter`], each generation it has
//! applied together with what it could not apply. Calls that change what
//! it serves wait for that report with [`Applied::wait`].
//!
//! A consumer may skip generations: every state holds all earlier changes,
//! so a report for generation `g` covers every change up to `g`.
//!
//! What a waiting call learns ([`Unapplied`]) decides what becomes of its
//! change: one the consumer tried and could not apply is undone by the
//! caller (see [`crate::model::State::revert`]); one it has not reported
//! on yet stays stored, as it may still be applied.
//!
//! This module does no I/O and starts no task; the consumer's loop lives
//! with the consumer (the daemon).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// How long [`Applied::wait`] waits by default: far longer than applying
/// a change takes, short enough that a stuck consumer is reported.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Something a consumer could not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The resource's name, as the API spells it
    /// (`subsystems/vol1/namespaces/2`).
    pub resource: String,
    /// What went wrong.
    pub reason: String,
}

/// The newest report of a consumer.
#[derive(Debug, Clone, Default)]
struct Report {
    /// The newest generation applied (or refused).
    generation: u64,
    /// What that generation's state asks for and is not served.
    problems: Arc<Vec<Problem>>,
    /// Why the consumer refused that generation's state as a whole, if it
    /// did; it then serves the state it had.
    refused: Option<Arc<Refusal>>,
}

/// A consumer's refusal of a whole state.
#[derive(Debug)]
struct Refusal {
    /// Why, as the consumer says it.
    reason: String,
    /// The resources whose changes are at fault.
    resources: Vec<String>,
}

/// The consumer's side: reports the generations it applied.
#[derive(Debug)]
pub struct Reporter {
    tx: watch::Sender<Report>,
}

impl Reporter {
    /// The consumer has applied the state of `generation`; `problems` is
    /// what it could not apply of that state (it replaces earlier
    /// reports, so a problem that went away is forgotten).
    pub fn report(&self, generation: u64, problems: Vec<Problem>) {
        self.tx.send_replace(Report {
            generation,
            problems: Arc::new(problems),
            refused: None,
        });
    }

    /// The consumer has refused the state of `generation` as a whole, for
    /// `reason`, which concerns `resources` (named as the API does), and
    /// keeps serving the state it had. The control plane accepted that
    /// state, so the two disagree on what is valid: a fault of the
    /// service, not of a request. A call that changed one of `resources`
    /// fails ([`Unapplied::Refused`]) and undoes its change; one that
    /// changed something else waits on for the state the consumer takes
    /// once that is done.
    pub fn refuse(&self, generation: u64, reason: String, resources: Vec<String>) {
        self.tx.send_replace(Report {
            generation,
            problems: Arc::default(),
            refused: Some(Arc::new(Refusal { reason, resources })),
        });
    }
}

/// Why [`Applied::wait`] cannot answer that a change is applied. The
/// message names the consumer and, where it reported one, the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unapplied {
    /// The consumer tried and could not apply some of the change's
    /// resources with what it runs on (a backing file whose directory is
    /// missing, an address another socket holds); names each with its
    /// reason. The client can remove the cause and try again.
    #[error("{0}")]
    Problems(String),
    /// The consumer refused the state holding the change as a whole,
    /// naming one of the change's resources ([`Reporter::refuse`]), and
    /// serves the state it had.
    #[error("{0}")]
    Refused(String),
    /// The consumer stopped following the state, or has not reached the
    /// change within the limit: it may still apply it.
    #[error("{0}")]
    Pending(String),
}

/// The waiting side: how far the consumer has got. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The consumer, for messages ("the NVMe-oF target").
    consumer: &'static str,
    rx: watch::Receiver<Report>,
    limit: Duration,
}

/// A consumer named `consumer` (for messages) that has applied
/// `generation` so far, usually the state it started from. Dropping the
/// [`Reporter`] tells waiters that it stopped.
pub fn follow(consumer: &'static str, generation: u64) -> (Reporter, Applied) {
    let (tx, rx) = watch::channel(Report {
        generation,
        ..Report::default()
    });
    let applied = Applied {
        consumer,
        rx,
        limit: WAIT_LIMIT,
    };
    (Reporter { tx }, applied)
}

impl Applied {
    /// The same, waiting at most `limit` instead of [`WAIT_LIMIT`].
    pub fn with_limit(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// The newest generation the consumer has applied.
    pub fn generation(&self) -> u64 {
        self.rx.borrow().generation
    }

    /// Waits until the consumer has applied `generation` (or a later one),
    /// then checks that it serves the `resources` the change created or
    /// changed.
    ///
    /// # Errors
    /// [`Unapplied::Problems`] if the consumer reports a problem with one
    /// of `resources`; [`Unapplied::Refused`] if it refused the state
    /// naming one of `resources` (a refusal naming others is waited out);
    /// [`Unapplied::Pending`] if it stopped or has not got that far within
    /// the limit. The change stays stored in every case:
    /// what becomes of it is the caller's decision.
    pub async fn wait(&self, generation: u64, resources: &[&str]) -> Result<(), Unapplied> {
        let mut rx = self.rx.clone();
        let consumer = self.consumer;
        let settled = |r: &Report| {
            r.generation >= generation
                && r.refused
                    .as_ref()
                    .is_none_or(|f| f.resources.iter().any(|n| resources.contains(&n.as_str())))
        };
        let report = match tokio::time::timeout(self.limit, rx.wait_for(settled)).await {
            Ok(Ok(r)) => r.clone(),
            Ok(Err(_)) => {
                return Err(Unapplied::Pending(format!(
                    "{consumer} stopped applying changes"
                )))
            }
            Err(_) => {
                let limit = self.limit;
                return Err(Unapplied::Pending(match &self.rx.borrow().refused {
                    Some(f) => format!(
                        "{consumer} has not applied the change within {limit:?}: it refuses the state holding it ({})",
                        f.reason
                    ),
                    None => format!(
                        "{consumer} has not applied the change within {limit:?}; it applies it when it catches up"
                    ),
                }));
            }
        };
        if let Some(f) = &report.refused {
            return Err(Unapplied::Refused(format!(
                "{consumer} refused the state holding the change ({})",
                f.reason
            )));
        }
        let failed: Vec<String> = report
            .problems
            .iter()
            .filter(|p| resources.contains(&p.resource.as_str()))
            .map(|p| format!("{}: {}", p.resource, p.reason))
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(Unapplied::Problems(format!(
                "{consumer} could not apply it ({})",
                failed.join("; ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(resource: &str) -> Problem {
        Problem {
            resource: resource.into(),
            reason: "disk on fire".into(),
        }
    }

    #[tokio::test]
    async fn waits_for_the_generation_and_reports_its_own_problems() {
        let (rep, applied) = follow("the target", 3);
        // Already applied: no wait.
        applied.wait(2, &[]).await.unwrap();
        applied.wait(3, &["x"]).await.unwrap();
        let waiter = {
            let a = applied.clone();
            tokio::spawn(async move { a.wait(5, &["subsystems/a/namespaces/1"]).await })
        };
        tokio::task::yield_now().await;
        rep.report(4, vec![]);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "generation 4 is not 5");
        // Skipping a generation covers it; another resource's problem is
        // not this change's.
        rep.report(6, vec![problem("subsystems/a/namespaces/2")]);
        waiter.await.unwrap().unwrap();
        assert_eq!(applied.generation(), 6);
        let err = applied
            .wait(6, &["subsystems/a/namespaces/2"])
            .await
            .unwrap_err();
        assert_eq!(
            err,
            Unapplied::Problems(
                "the target could not apply it (subsystems/a/namespaces/2: disk on fire)".into()
            )
        );
    }

    #[tokio::test]
    async fn a_refused_state_fails_the_changes_it_names_and_holds_up_others() {
        let (rep, applied) = follow("the switch", 1);
        let red = ["tenants/red"];
        let waiter = {
            let a = applied.clone();
            tokio::spawn(async move { a.wait(2, &["tenants/blue"]).await })
        };
        rep.refuse(
            3,
            "tenant red: port 9 does not exist".into(),
            vec![red[0].into()],
        );
        for g in [2, 3] {
            assert_eq!(
                applied.wait(g, &red).await.unwrap_err(),
                Unapplied::Refused(
                    "the switch refused the state holding the change \
                     (tenant red: port 9 does not exist)"
                        .into()
                )
            );
        }
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "blue's change is not at fault");
        let err = applied
            .clone()
            .with_limit(Duration::from_millis(20))
            .wait(2, &["tenants/blue"])
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Unapplied::Pending(m) if m.ends_with("it refuses the state holding it (tenant red: port 9 does not exist)")),
            "{err}"
        );
        // The state without red's change holds blue's.
        rep.report(4, vec![]);
        waiter.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_stopped_or_stuck_consumer_is_an_error_not_a_hang() {
        let (rep, applied) = follow("the target", 0);
        let applied = applied.with_limit(Duration::from_millis(50));
        let err = applied.wait(1, &[]).await.unwrap_err();
        assert!(
            matches!(&err, Unapplied::Pending(m) if m.contains("within")),
            "{err}"
        );
        drop(rep);
        let err = applied.wait(1, &[]).await.unwrap_err();
        assert!(
            matches!(&err, Unapplied::Pending(m) if m.contains("stopped")),
            "{err}"
        );
        // What it had applied before it stopped still counts.
        applied.wait(0, &[]).await.unwrap();
    }
}
