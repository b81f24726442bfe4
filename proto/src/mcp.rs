//! The MCP requests between a node and a Computer's agent (the `Mcp` call of `agent.proto`
//! carries them as JSON): one serde type for both ends, so the node builds [`McpRequest`]s and
//! reads [`McpReply`]s instead of hand-written JSON.

use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;

/// What the node asks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum McpRequest {
    /// Install a package from the workspace and bind it (new UID, HOME, state).
    #[serde(rename_all = "camelCase")]
    Install {
        /// The binding's id (chosen by the node, recorded in the store first).
        binding_id: String,
        /// The bot it is installed for: a package is (bot, id, version, SHA-256), and a switch
        /// moves a binding only to a version its own bot installed on the Computer. (Missing from
        /// an older node's request: the agent refuses the install.)
        #[serde(default)]
        bot_id: String,
        /// The archive, relative to the workspace.
        artifact_path: String,
        /// The manifest (unknown fields refused).
        manifest: Value,
    },
    /// List the binding's tools.
    #[serde(rename_all = "camelCase")]
    Discover {
        /// The binding.
        binding_id: String,
    },
    /// Call a tool.
    #[serde(rename_all = "camelCase")]
    Call {
        /// The binding.
        binding_id: String,
        /// The tool.
        tool: String,
        /// Its arguments.
        arguments: serde_json::Map<String, Value>,
        /// The journal's name for this call (64 hex digits): the agent keeps its answer under
        /// it, so the store journals only the answer's digest and a replay reads it back
        /// ([`McpRequest::Result`]). Absent: the answer is not kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        operation: Option<String>,
    },
    /// The kept answer of an earlier call (`{"reply": {"ok": …} | {"error": …}}`), or the
    /// refusal `result_expired` once it is past the agent's retention or evicted.
    #[serde(rename_all = "camelCase")]
    Result {
        /// The binding the call was made on.
        binding_id: String,
        /// The call's journal name, as in [`McpRequest::Call`].
        operation: String,
    },
    /// Move the binding to another installed version of its package, keeping its UID and state.
    #[serde(rename_all = "camelCase")]
    Switch {
        /// The binding.
        binding_id: String,
        /// The operation (names the protected receipt).
        operation_id: String,
        /// The version the store saw the binding at.
        from_version: String,
        /// The version to move to.
        version: String,
    },
    /// Close the binding for good and kill its processes.
    #[serde(rename_all = "camelCase")]
    Revoke {
        /// The binding.
        binding_id: String,
    },
}

/// What the agent answers: a result, or a refusal with a stable reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpReply {
    /// The answer (tools, a call's MCP result, `{"drained"}`), when it worked.
    pub result: Option<Value>,
    /// Why not.
    pub error: Option<McpFailure>,
}

/// A refusal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpFailure {
    /// A stable code (`digest_mismatch`, `symlink`, `revoked`, `deadline`, ...).
    pub reason: String,
    /// For people.
    pub message: String,
}

impl McpReply {
    /// A result.
    pub fn ok(v: Value) -> Self {
        McpReply { result: Some(v), error: None }
    }
    /// A refusal with its stable reason.
    pub fn fail(reason: &str, message: impl Into<String>) -> Self {
        McpReply { result: None, error: Some(McpFailure { reason: reason.into(), message: message.into() }) }
    }
}
