//! A provider for tests, with injectable faults. It keeps its "sandboxes" as lines in a journal
//! file, one line per effect, so a test can count exactly how many calls reached it, even
//! across node processes.
//!
//! Config (`config.faults`, per operation `create|pause|resume|delete|recreate`):
//! `"ok"` (default), `"lost"` (does it, then loses the answer), `"not_sent"` (fails before
//! sending), `"reject"` (answers no, does nothing), `"slow:MS"` (does it, answers after MS),
//! `"hang"` (does it, never answers), `"panic"` (does it, then panics inside the call, so inside
//! the Computer actor's handler: the actor crashes with the call dispatched and unanswered).
//! Enabled only on nodes started with a fake-provider dir.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use serde_json::json;

use crate::provider::CreateSpec;
use crate::provider::Provider;
use crate::provider::ProviderError;
use crate::provider::SandboxInfo;

/// One injectable behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Works.
    Ok,
    /// Does it, loses the answer.
    Lost,
    /// Fails before sending.
    NotSent,
    /// Refuses.
    Reject,
    /// Does it, answers late.
    Slow(Duration),
    /// Does it, never answers.
    Hang,
    /// Does it, then panics in the caller's task (a crash of whoever made the call).
    Panic,
}

impl Fault {
    /// Parses a fault name; unknown names are an error (config is user input).
    pub fn parse(s: &str) -> Result<Fault, String> {
        Ok(match s {
            "ok" => Fault::Ok,
            "lost" => Fault::Lost,
            "not_sent" => Fault::NotSent,
            "reject" => Fault::Reject,
            "hang" => Fault::Hang,
            "panic" => Fault::Panic,
            other => match other.strip_prefix("slow:").and_then(|ms| ms.parse::<u64>().ok()) {
                Some(ms) => Fault::Slow(Duration::from_millis(ms)),
                None => return Err(format!("unknown fault {other:?}")),
            },
        })
    }
}

/// The fake provider of one provider record.
pub struct FakeProvider {
    journal: PathBuf,
    faults: Value,
}

impl FakeProvider {
    /// A fake writing its journal to `journal`, with `config` from the provider record.
    pub fn new(journal: PathBuf, config: &serde_json::Map<String, Value>) -> Self {
        Self { journal, faults: config.get("faults").cloned().unwrap_or(Value::Null) }
    }

    /// Checks a provider config before it is stored.
    pub fn check_config(config: &serde_json::Map<String, Value>) -> Result<(), String> {
        for (k, v) in config {
            match k.as_str() {
                "faults" => {
                    let m = v.as_object().ok_or("faults must be an object")?;
                    for (op, f) in m {
                        if !["create", "pause", "resume", "delete", "recreate"].contains(&op.as_str()) {
                            return Err(format!("unknown operation {op:?} in faults"));
                        }
                        Fault::parse(f.as_str().ok_or("a fault is a string")?)?;
                    }
                }
                "timeoutMs" => {
                    v.as_u64().filter(|t| (1..=600_000).contains(t)).ok_or("timeoutMs must be 1..=600000")?;
                }
                other => return Err(format!("unknown fake provider config field {other:?}")),
            }
        }
        Ok(())
    }

    fn fault(&self, op: &str) -> Fault {
        self.faults.get(op).and_then(Value::as_str).and_then(|s| Fault::parse(s).ok()).unwrap_or(Fault::Ok)
    }

    fn record(&self, line: Value) -> Result<(), ProviderError> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.journal)
            .map_err(|e| ProviderError::NotSent(format!("journal: {e}")))?;
        // One write per line: nodes (a deposed leader finishing a call it had sent, and the new
        // one) append to the same journal, and formatted writes could interleave mid-line.
        let mut text = line.to_string();
        text.push('\n');
        f.write_all(text.as_bytes())
            .and_then(|_| f.sync_data())
            .map_err(|e| ProviderError::NotSent(format!("journal: {e}")))
    }

    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.journal)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Runs one operation under its fault: `effect` is the journal line of the effect.
    async fn run(&self, op: &str, effect: Value) -> Result<(), ProviderError> {
        match self.fault(op) {
            Fault::NotSent => Err(ProviderError::NotSent("injected: not sent".into())),
            Fault::Reject => {
                self.record(json!({"op": op, "rejected": true, "effect": effect}))?;
                Err(ProviderError::Rejected("injected: rejected".into()))
            }
            Fault::Ok => self.record(effect),
            Fault::Lost => {
                self.record(effect)?;
                Err(ProviderError::Lost("injected: answer lost".into()))
            }
            Fault::Slow(d) => {
                self.record(effect)?;
                tokio::time::sleep(d).await;
                Ok(())
            }
            Fault::Hang => {
                self.record(effect)?;
                std::future::pending::<()>().await;
                Ok(())
            }
            Fault::Panic => {
                self.record(effect)?;
                panic!("injected: the caller crashed during a {op}");
            }
        }
    }
}

#[async_trait]
impl Provider for FakeProvider {
    async fn create(&self, spec: &CreateSpec) -> Result<String, ProviderError> {
        let sandbox = format!("fake-{}", spec.computer_id);
        let effect =
            json!({"op": "create", "computerId": spec.computer_id, "commandKey": spec.command_key, "sandbox": sandbox});
        self.run("create", effect).await.map(|()| sandbox)
    }

    async fn pause(&self, sandbox: &str, command_key: &str) -> Result<(), ProviderError> {
        self.run("pause", json!({"op": "pause", "sandbox": sandbox, "commandKey": command_key})).await
    }

    async fn resume(&self, sandbox: &str, command_key: &str) -> Result<(), ProviderError> {
        self.run("resume", json!({"op": "resume", "sandbox": sandbox, "commandKey": command_key})).await
    }

    async fn delete(&self, sandbox: &str, command_key: &str) -> Result<(), ProviderError> {
        self.run("delete", json!({"op": "delete", "sandbox": sandbox, "commandKey": command_key})).await
    }

    async fn recreate(&self, sandbox: &str, spec: &CreateSpec) -> Result<String, ProviderError> {
        let new = format!("fake-{}", spec.computer_id);
        let effect = json!({"op": "recreate", "old": sandbox, "computerId": spec.computer_id,
            "commandKey": spec.command_key, "template": spec.template, "sandbox": new});
        self.run("recreate", effect).await.map(|()| new)
    }

    async fn inspect(&self, computer_id: &str) -> Result<Option<SandboxInfo>, ProviderError> {
        let sandbox = format!("fake-{computer_id}");
        let mut state = None;
        for l in self.lines().iter().filter(|l| l["sandbox"] == sandbox.as_str() && l.get("rejected").is_none()) {
            state = match l["op"].as_str() {
                Some("create") | Some("resume") | Some("recreate") => Some("running"),
                Some("pause") => Some("paused"),
                Some("delete") => None,
                _ => state,
            };
        }
        Ok(state.map(|s| SandboxInfo { sandbox, state: s.into() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(dir: &tempfile::TempDir, faults: Value) -> FakeProvider {
        let cfg = json!({"faults": faults});
        FakeProvider::new(dir.path().join("j.jsonl"), cfg.as_object().expect("object"))
    }

    #[tokio::test]
    async fn faults_behave_as_named_and_effects_are_journaled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = CreateSpec {
            computer_id: "cmp_1".into(),
            command_key: "k".into(),
            template: None,
            desktop: false,
            pairing_code: None,
            first_uid: None,
            env: Default::default(),
            resources: None,
            metadata: Default::default(),
            egress: None,
        };
        let p = fake(&dir, json!({"create": "lost", "pause": "not_sent", "resume": "reject"}));
        assert!(matches!(p.create(&spec).await, Err(ProviderError::Lost(_))));
        assert!(matches!(p.pause("fake-cmp_1", "k").await, Err(ProviderError::NotSent(_))));
        assert!(matches!(p.resume("fake-cmp_1", "k").await, Err(ProviderError::Rejected(_))));
        assert_eq!(
            p.inspect("cmp_1").await,
            Ok(Some(SandboxInfo { sandbox: "fake-cmp_1".into(), state: "running".into() }))
        );
        p.delete("fake-cmp_1", "k").await.expect("delete");
        assert_eq!(p.inspect("cmp_1").await, Ok(None));
        // create (lost, but done), rejected resume, delete: three lines; the not-sent pause none.
        assert_eq!(p.lines().len(), 3);
    }

    #[tokio::test]
    async fn panic_does_it_then_panics_in_the_callers_task() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = fake(&dir, json!({"pause": "panic"}));
        let call = tokio::spawn(async move { p.pause("fake-cmp_1", "k").await.is_ok() });
        assert!(call.await.expect_err("the call panics").is_panic());
        let journal = FakeProvider::new(dir.path().join("j.jsonl"), &serde_json::Map::new());
        assert_eq!(
            journal.lines(),
            vec![json!({"op": "pause", "sandbox": "fake-cmp_1", "commandKey": "k"})],
            "the effect happened"
        );
    }

    #[test]
    fn config_is_checked() {
        let ok = json!({"faults": {"create": "slow:20", "delete": "panic"}, "timeoutMs": 500});
        assert!(FakeProvider::check_config(ok.as_object().expect("o")).is_ok());
        for bad in [json!({"faults": {"create": "explode"}}), json!({"faults": {"fly": "ok"}}), json!({"x": 1})] {
            assert!(FakeProvider::check_config(bad.as_object().expect("o")).is_err(), "{bad}");
        }
    }
}
