//! A client of the computerd HTTP API.
//!
//! Lifecycle commands are idempotent by command key. [`Computers::create`] prepares a command
//! once (it picks the key); [`PreparedCommand::send`] may then be called again after a lost
//! answer, with the same key and body, and answers the same execution receipt (SPEC §1). Never
//! make a new command for a retry: a lost answer to a delete does not prove removal.
//!
//! ```no_run
//! # async fn demo() -> Result<(), computerd_client::Error> {
//! use computerd_client::{Client, NewComputer, Source};
//! let client = Client::new("http://127.0.0.1:8080", "cdt_…");
//! let create = client.computers().create(NewComputer::new(Source::provider("cpp_…")));
//! let receipt = match create.send().await {
//!     Ok(r) => r,
//!     Err(e) if e.is_retryable() => create.send().await?, // same key, same body
//!     Err(e) => return Err(e),
//! };
//! let done = client.wait_execution(&receipt.execution_id, std::time::Duration::from_secs(60)).await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

use std::time::Duration;

use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;
use serde_json::json;

/// A client error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request did not complete (connection refused, reset, timed out): the command may or
    /// may not have been stored. Send the same prepared command again.
    #[error("transport: {0}")]
    Transport(#[from] reqwest::Error),
    /// The API answered an error.
    #[error("{status} {kind}: {message} (error id {error_id})")]
    Api {
        /// HTTP status.
        status: u16,
        /// The error kind (`forbidden`, `ComputerConflict`, …).
        kind: String,
        /// Message.
        message: String,
        /// The server-side error id.
        error_id: String,
        /// For `ComputerConflict`: the execution that holds the Computer.
        execution_id: Option<String>,
    },
    /// A wait ran out.
    #[error("timed out waiting for {0}")]
    Timeout(String),
}

impl Error {
    /// True when sending the same prepared command again is the right reaction.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Transport(_) => true,
            Error::Api { status, .. } => *status == 503,
            Error::Timeout(_) => false,
        }
    }
}

/// An execution receipt.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    /// `exe_…`
    pub execution_id: String,
    /// The command key.
    pub command_key: String,
    /// `create`, `pause`, `resume`, `delete`.
    pub kind: String,
    /// `pending`, `running`, `succeeded`, `failed`, `outcome_unknown`.
    pub state: String,
    /// The Computer.
    pub resource: Resource,
    /// The pairing code of a succeeded paired create (for its requester).
    #[serde(default)]
    pub pairing_code: Option<String>,
    /// The approval a pending execution waits for.
    #[serde(default)]
    pub approval_id: Option<String>,
}

/// What an execution is about.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Resource {
    /// `computer`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `cmp_…`
    pub id: String,
}

/// Where a Computer runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "_tag")]
pub enum Source {
    /// A provider sandbox.
    Provider {
        /// `cpp_…`
        provider: String,
        /// A template, if any.
        template: Option<String>,
    },
    /// An own machine, paired with a code.
    Paired,
}

impl Source {
    /// A sandbox of `provider` with its default template.
    pub fn provider(provider: impl Into<String>) -> Self {
        Source::Provider { provider: provider.into(), template: None }
    }
}

/// The body of a create, without its key.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewComputer {
    /// Display name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where it runs.
    pub source: Source,
    /// Screenshots, mouse, keyboard.
    pub desktop: bool,
    /// Seconds without work before pausing; `None` = never.
    pub pause_after: Option<u64>,
    /// Owned by the organization.
    pub shared: bool,
}

impl NewComputer {
    /// Defaults: no name, no desktop, pause after 600 s, not shared.
    pub fn new(source: Source) -> Self {
        Self { name: None, source, desktop: false, pause_after: Some(600), shared: false }
    }
}

/// A command with its key fixed once; [`PreparedCommand::send`] is safe to repeat.
#[derive(Debug, Clone)]
pub struct PreparedCommand {
    client: Client,
    method: reqwest::Method,
    path: String,
    body: Value,
}

impl PreparedCommand {
    /// The command key.
    pub fn command_key(&self) -> &str {
        self.body["commandKey"].as_str().unwrap_or_default()
    }

    /// A command prepared earlier (its method, path and body, key included), e.g. kept on disk
    /// while its answer was outstanding: sending it again is safe.
    pub fn restore(client: &Client, method: reqwest::Method, path: impl Into<String>, body: Value) -> Self {
        PreparedCommand { client: client.clone(), method, path: path.into(), body }
    }

    /// The method, path and body (key included), to keep the command until its answer arrives.
    pub fn parts(&self) -> (&reqwest::Method, &str, &Value) {
        (&self.method, &self.path, &self.body)
    }

    /// Sends the command; answers its receipt (the same one every time).
    pub async fn send(&self) -> Result<Receipt, Error> {
        let v = self.client.request(self.method.clone(), &self.path, Some(&self.body)).await?;
        serde_json::from_value(v).map_err(|e| Error::Api {
            status: 200,
            kind: "bad_answer".into(),
            message: e.to_string(),
            error_id: String::new(),
            execution_id: None,
        })
    }
}

/// A computerd API client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: String,
    http: reqwest::Client,
}

fn new_key() -> String {
    format!("ck_{}", hex::encode(rand::random::<[u8; 16]>()))
}

impl Client {
    /// A client of the API at `base` (e.g. `http://127.0.0.1:8080`) with a bearer token.
    pub fn new(base: impl Into<String>, token: impl Into<String>) -> Self {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap_or_default();
        Self { base: base.into().trim_end_matches('/').to_string(), token: token.into(), http }
    }

    /// A client that sends through `http` (e.g. one without a total timeout, for long copies and
    /// streams).
    pub fn with_http(base: impl Into<String>, token: impl Into<String>, http: reqwest::Client) -> Self {
        Self { base: base.into().trim_end_matches('/').to_string(), token: token.into(), http }
    }

    /// A request to `path` with the token, for answers that are not JSON (bytes, event streams).
    pub fn raw(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{}", self.base, path)).bearer_auth(&self.token)
    }

    /// Turns a non-2xx answer into [`Error::Api`] (reading its JSON error body); passes others on.
    pub async fn check(resp: reqwest::Response) -> Result<reqwest::Response, Error> {
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(resp);
        }
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        Err(api_error(status, &v))
    }

    /// Lifecycle commands on Computers.
    pub fn computers(&self) -> Computers<'_> {
        Computers { client: self }
    }

    /// One API call; answers the JSON body or the API error.
    pub async fn request(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<Value, Error> {
        let mut r = self.http.request(method, format!("{}{}", self.base, path)).bearer_auth(&self.token);
        if let Some(b) = body {
            r = r.json(b);
        }
        let resp = r.send().await?;
        let status = resp.status().as_u16();
        let v: Value = if status == 204 { Value::Null } else { resp.json().await? };
        if (200..300).contains(&status) {
            return Ok(v);
        }
        Err(api_error(status, &v))
    }

    /// Reads an execution.
    pub async fn execution(&self, id: &str) -> Result<Receipt, Error> {
        let v = self.request(reqwest::Method::GET, &format!("/v1/executions/{id}"), None).await?;
        serde_json::from_value(v).map_err(|e| Error::Api {
            status: 200,
            kind: "bad_answer".into(),
            message: e.to_string(),
            error_id: String::new(),
            execution_id: None,
        })
    }

    /// Waits until an execution is no longer pending or running.
    pub async fn wait_execution(&self, id: &str, timeout: Duration) -> Result<Receipt, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let r = self.execution(id).await?;
            if r.state != "pending" && r.state != "running" {
                return Ok(r);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout(format!("execution {id}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn api_error(status: u16, v: &Value) -> Error {
    let e = &v["error"];
    Error::Api {
        status,
        kind: e["kind"].as_str().unwrap_or("unknown").into(),
        message: e["message"].as_str().unwrap_or_default().into(),
        error_id: e["errorId"].as_str().unwrap_or_default().into(),
        execution_id: e["executionId"].as_str().map(String::from),
    }
}

/// Lifecycle commands; each is prepared once with its own key.
pub struct Computers<'a> {
    client: &'a Client,
}

impl Computers<'_> {
    /// Prepares a create.
    pub fn create(&self, new: NewComputer) -> PreparedCommand {
        let mut body = serde_json::to_value(&new).unwrap_or_else(|_| json!({}));
        body["commandKey"] = new_key().into();
        PreparedCommand {
            client: self.client.clone(),
            method: reqwest::Method::POST,
            path: "/v1/computers".into(),
            body,
        }
    }

    /// Prepares a pause.
    pub fn pause(&self, computer: &str) -> PreparedCommand {
        self.keyed(reqwest::Method::POST, format!("/v1/computers/{computer}/pause"))
    }

    /// Prepares a resume.
    pub fn resume(&self, computer: &str) -> PreparedCommand {
        self.keyed(reqwest::Method::POST, format!("/v1/computers/{computer}/resume"))
    }

    /// Prepares a recreate: a new sandbox (of `template`, when given), keeping the tool runtime.
    pub fn recreate(&self, computer: &str, template: Option<&str>) -> PreparedCommand {
        let mut p = self.keyed(reqwest::Method::POST, format!("/v1/computers/{computer}/recreate"));
        if let Some(t) = template {
            p.body["template"] = json!(t);
        }
        p
    }

    /// Prepares a delete.
    pub fn delete(&self, computer: &str) -> PreparedCommand {
        self.keyed(reqwest::Method::DELETE, format!("/v1/computers/{computer}"))
    }

    fn keyed(&self, method: reqwest::Method, path: String) -> PreparedCommand {
        PreparedCommand { client: self.client.clone(), method, path, body: json!({ "commandKey": new_key() }) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prepared_command_keeps_its_key_and_body() {
        let c = Client::new("http://127.0.0.1:1/", "t");
        let p = c.computers().create(NewComputer::new(Source::provider("cpp_1")));
        let again = p.clone();
        assert_eq!(p.command_key(), again.command_key());
        assert!(p.command_key().starts_with("ck_"));
        assert_eq!(p.body["source"], json!({"_tag": "Provider", "provider": "cpp_1", "template": null}));
        assert_eq!(p.body["pauseAfter"], 600);
        assert_ne!(c.computers().pause("cmp_1").command_key(), c.computers().pause("cmp_1").command_key());
        assert_eq!(c.base, "http://127.0.0.1:1");
    }
}
