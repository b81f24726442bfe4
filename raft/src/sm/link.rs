//! Paired machines and their links: a pairing code redeemed once for a machine credential, link
//! generations (`LinkUp` answers the next one; `LinkDown` and session reports apply only from the
//! current one, so an older link never touches a newer), and the `computer_session` events of
//! sessions that ended after their wait.

use super::model::ComputerState;
use super::model::ExecutionState;
use super::model::Source;
use super::response::Reject;
use super::response::RejectKind;
use super::state::State;

impl State {
    /// Whether a Computer's sandbox runs `computer-agent` (its provider kind starts one).
    pub fn runs_agent(&self, computer_id: &str) -> bool {
        let Some(Source::Provider { provider, .. }) = self.computers.get(computer_id).map(|c| &c.source) else {
            return false;
        };
        self.providers.get(provider).is_some_and(|p| p.kind.runs_agent())
    }

    /// Redeems a pairing code once, before it expires; the Computer keeps the credential's hash.
    pub(crate) fn redeem_pairing(&mut self, code: &str, credential_hash: &str, at: u64) -> Result<String, Reject> {
        let invalid =
            || Reject::new(RejectKind::Unauthorized, "the pairing code is not valid (wrong, used or expired)");
        let exe = self
            .executions_with_code(code)
            // A sandbox's agent pairs as soon as it starts, possibly before the create's answer
            // is recorded (or when that answer was lost): a dispatched create counts too.
            .find(|e| match e.state {
                ExecutionState::Succeeded | ExecutionState::OutcomeUnknown => true,
                ExecutionState::Running => e.dispatched_at.is_some(),
                _ => false,
            })
            .cloned()
            .ok_or_else(invalid)?;
        if exe.pairing_expires_at.is_none_or(|exp| at >= exp) {
            return Err(invalid());
        }
        let c = self.computers.get(&exe.computer_id).ok_or_else(invalid)?;
        if c.state == ComputerState::Deleted {
            return Err(invalid());
        }
        self.clear_pairing_code(&exe.id);
        if let Some(c) = self.computers.get_mut(&exe.computer_id) {
            c.agent_credential = Some(credential_hash.to_string());
        }
        // A recreate's new sandbox pairing: the old agent's credential is replaced above, so its
        // link (if one is still recorded) is over; the Computer starts until the new one links.
        if exe.kind == super::ExecutionKind::Recreate {
            if let Some(c) = self.computers.get_mut(&exe.computer_id) {
                c.link_node = None;
                c.link_generation += 1;
            }
            let running = self.computers.get(&exe.computer_id).is_some_and(|c| c.state == ComputerState::Running);
            if running {
                self.set_computer_state(&exe.computer_id, ComputerState::Starting, at);
            }
        }
        Ok(exe.computer_id)
    }

    /// The desktop's input lease changed, as the agent of link `generation` reports: an event
    /// `DesktopLeaseChanged {"holder"}`. A report of an older link is refused.
    pub(crate) fn desktop_lease(
        &mut self,
        computer_id: &str,
        generation: u64,
        holder: Option<&str>,
        at: u64,
    ) -> Result<(), Reject> {
        let c = self.computers.get(computer_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such computer"))?;
        if c.state == ComputerState::Deleted || c.link_generation != generation {
            return Err(Reject::new(RejectKind::Conflict, "a report of a link that has ended"));
        }
        if holder.is_some_and(|h| h.len() > 200) {
            return Err(Reject::new(RejectKind::Invalid, "a lease holder is at most 200 bytes"));
        }
        self.push_event(at, "DesktopLeaseChanged", computer_id, None, serde_json::json!({"holder": holder}));
        Ok(())
    }

    /// The desktop as the agent of link `generation` reports it, kept in the Computer.
    pub(crate) fn desktop_status(
        &mut self,
        computer_id: &str,
        generation: u64,
        desktop: &super::model::DesktopView,
    ) -> Result<(), Reject> {
        let ok = desktop.display.len() <= 16
            && desktop.display.starts_with(':')
            && matches!(desktop.state.as_str(), "starting" | "running" | "failed")
            && desktop.width.is_none_or(|w| (1..=16384).contains(&w))
            && desktop.height.is_none_or(|h| (1..=16384).contains(&h));
        if !ok {
            return Err(Reject::new(RejectKind::Invalid, "not a desktop report"));
        }
        let c =
            self.computers.get_mut(computer_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such computer"))?;
        if c.state == ComputerState::Deleted || c.link_generation != generation {
            return Err(Reject::new(RejectKind::Conflict, "a report of a link that has ended"));
        }
        c.desktop_view = Some(desktop.clone());
        Ok(())
    }

    /// An agent showed its credential on a node: the link gets the next generation.
    pub(crate) fn link_up(
        &mut self,
        computer_id: &str,
        credential_hash: &str,
        node: u64,
        at: u64,
    ) -> Result<u64, Reject> {
        let refused = || Reject::new(RejectKind::Unauthorized, "the machine credential is not valid");
        let c = self.computers.get_mut(computer_id).ok_or_else(refused)?;
        if c.state == ComputerState::Deleted || c.agent_credential.as_deref() != Some(credential_hash) {
            return Err(refused());
        }
        c.link_generation += 1;
        c.link_node = Some(node);
        let generation = c.link_generation;
        let to = if matches!(c.state, ComputerState::Offline | ComputerState::Starting) {
            Some(ComputerState::Running)
        } else {
            None
        };
        self.push_event(
            at,
            "AgentLinked",
            computer_id,
            None,
            serde_json::json!({"generation": generation, "node": node}),
        );
        if let Some(to) = to {
            self.set_computer_state(computer_id, to, at);
        }
        Ok(generation)
    }

    /// A link ended. An older generation's end never touches a newer link.
    pub(crate) fn link_down(&mut self, computer_id: &str, generation: u64, at: u64) -> Result<(), Reject> {
        let c =
            self.computers.get_mut(computer_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such computer"))?;
        if c.link_generation != generation {
            return Err(Reject::new(RejectKind::Conflict, "a newer link replaced this one"));
        }
        c.link_node = None;
        let paired = c.source == Source::Paired;
        let running = c.state == ComputerState::Running;
        if paired && running {
            self.set_computer_state(computer_id, ComputerState::Offline, at);
        }
        Ok(())
    }

    /// A command ended after its wait: one `computer_session` event per session, reported by the
    /// current link only.
    #[allow(clippy::too_many_arguments)] // the fields of one report
    pub(crate) fn session_ended(
        &mut self,
        computer_id: &str,
        generation: u64,
        session_id: &str,
        owner: &str,
        exit_code: Option<i32>,
        signal: Option<&str>,
        at: u64,
    ) -> Result<(), Reject> {
        let c = self.computers.get(computer_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such computer"))?;
        if c.link_generation != generation {
            return Err(Reject::new(RejectKind::Conflict, "a newer link replaced this one"));
        }
        if !self.session_end_seen(session_id) {
            let data =
                serde_json::json!({"sessionId": session_id, "owner": owner, "exitCode": exit_code, "signal": signal});
            self.push_event(at, "computer_session", computer_id, None, data);
        }
        Ok(())
    }
}
