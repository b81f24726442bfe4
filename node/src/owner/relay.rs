//! MCP requests for a Computer's agent, wherever its link is: on this node over the link, on
//! another over `Routing.RelayMcp` (the sending node checked the caller's rights and journaled
//! the call; the owner checks that it holds the link, checks the caller's rights again at a
//! current read of its own, [`computerd_raft::sm::State::check_tool_request`], and asks its
//! agent).

use computerd_proto::agent::McpJson;
use computerd_proto::cluster::McpRelay;
use computerd_proto::mcp::McpReply;
use computerd_proto::mcp::McpRequest;
use futures::StreamExt;

use super::CallError;
use super::CallKind;
use super::Miss;
use super::Owners;
use super::Place;
use computerd_proto::ErrorKind;

impl Owners {
    /// Sends `request` to the Computer's agent: here, or relayed to the node holding its link
    /// (following one stale view), for the caller of token `token_id`, whose rights the owner
    /// checks again. `local` gives the client when the link is (or is expected) here: the
    /// caller's own rules for a Computer that is paused or starting apply there.
    pub async fn mcp<E: From<CallError>>(
        &self,
        computer: &str,
        request: &McpRequest,
        token_id: &str,
        local: impl Future<Output = Result<computerd_actors::link::Agent, E>>,
    ) -> Result<McpReply, E> {
        let json = serde_json::to_string(request)
            .map_err(|e| CallError::new(ErrorKind::Internal, format!("cannot encode the request: {e}")))?;
        let answer = match self.locate(computer).await {
            Place::At(node) => match self.relay(computer, node, &json, token_id).await {
                Ok(json) => Some(json),
                Err(Miss::Nobody) => None,
                Err(Miss::Failed(e)) => return Err(e.into()),
            },
            Place::Here(_) | Place::Nowhere => None,
        };
        let json = match answer {
            Some(json) => json,
            None => {
                let mut agent = local.await?;
                ask_agent(&mut agent, json).await.map_err(CallError::from_status)?
            }
        };
        let reply = serde_json::from_str(&json).map_err(|_| {
            CallError::new(ErrorKind::ComputerExecutionFailed, "the agent's answer is not an MCP reply")
        })?;
        Ok(reply)
    }

    async fn relay(
        &self,
        computer: &str,
        node: computerd_raft::NodeId,
        json: &str,
        token_id: &str,
    ) -> Result<String, Miss> {
        let reached = self
            .reach(node, CallKind::Tool, |mut client, deadline| {
                let mut req = tonic::Request::new(McpRelay {
                    computer_id: computer.to_string(),
                    json: json.to_string(),
                    token_id: token_id.to_string(),
                });
                req.set_timeout(deadline);
                async move { client.relay_mcp(req).await }
            })
            .await?;
        let node = reached.node;
        let mut replies = super::until(reached.value, reached.deadline, node);
        match replies.next().await {
            Some(Ok(reply)) => Ok(reply.json),
            Some(Err(e)) => Err(Miss::Failed(e)),
            None => Err(Miss::Failed(CallError::unreachable(node, "an empty answer"))),
        }
    }
}

/// One MCP request to an agent over its link held here, under the tool deadline (the one
/// bound of both the local path and a relayed request's owner).
pub async fn ask_agent(agent: &mut computerd_actors::link::Agent, json: String) -> Result<String, tonic::Status> {
    let mut req = tonic::Request::new(McpJson { json });
    req.set_timeout(CallKind::Tool.deadline());
    match tokio::time::timeout(CallKind::Tool.deadline(), agent.mcp(req)).await {
        Ok(r) => Ok(r?.into_inner().json),
        Err(_) => {
            Err(ErrorKind::DeadlineExceeded
                .status("the computer's agent did not answer the tool request by its deadline"))
        }
    }
}
