//! Derived indexes over the identity records, so that the caps on members, bots, tokens and
//! providers, and the retention of dead tokens, are checked and found without a walk:
//!
//! - **Live tokens per principal** (not revoked): the cap [`MAX_TOKENS_PER_PRINCIPAL`] is one
//!   `len()`, and archiving a bot finds its tokens.
//! - **Dead tokens**, oldest first, by when they stopped working: their revocation, or else
//!   their bot's archiving. Retention compacts them from the front (`retention`).
//! - **Live bots per member**: for the cap of [`Limits`].
//! - **Members by e-mail** and **providers by name**: uniqueness in one lookup.
//!
//! None of it is serialized: [`State::reindex_identity`] rebuilds it from the records when a
//! snapshot loads (through `reindex_executions`). Every change to `members`, `bots`, `tokens`
//! or `providers` goes through the helpers here, so the index always equals a rebuild.
//!
//! [`MAX_TOKENS_PER_PRINCIPAL`]: super::identity::MAX_TOKENS_PER_PRINCIPAL
//! [`Limits`]: super::limits::Limits

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use super::identity::Bot;
use super::identity::Member;
use super::identity::Principal;
use super::identity::Token;
use super::model::Provider;
use super::state::State;

/// See the module doc.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentityIndex {
    /// principal -> ids of its tokens that are not revoked.
    pub live_tokens: BTreeMap<Principal, BTreeSet<String>>,
    /// (stopped working at, token id) of revoked tokens and tokens of archived bots, oldest first.
    pub dead_tokens: BTreeSet<(u64, String)>,
    /// member id -> how many of its bots are not archived.
    pub live_bots: BTreeMap<String, usize>,
    /// e-mail -> member id.
    pub emails: BTreeMap<String, String>,
    /// provider name -> provider id.
    pub provider_names: BTreeMap<String, String>,
}

impl State {
    /// Rebuilds [`IdentityIndex`] from the records (when a snapshot loads).
    pub fn reindex_identity(&mut self) {
        let mut index = IdentityIndex::default();
        for m in self.members.values() {
            if let Some(email) = &m.email {
                index.emails.insert(email.clone(), m.id.clone());
            }
        }
        for b in self.bots.values().filter(|b| b.archived_at.is_none()) {
            *index.live_bots.entry(b.member_id.clone()).or_default() += 1;
        }
        for t in self.tokens.values() {
            if t.revoked_at.is_none() {
                index.live_tokens.entry(t.principal.clone()).or_default().insert(t.id.clone());
            }
            if let Some(at) = self.token_dead_at(t) {
                index.dead_tokens.insert((at, t.id.clone()));
            }
        }
        for p in self.providers.values() {
            index.provider_names.insert(p.name.clone(), p.id.clone());
        }
        self.identity_index = index;
    }

    /// When token `t` stopped working: its revocation, or else its bot's archiving; `None`
    /// while it works.
    fn token_dead_at(&self, t: &Token) -> Option<u64> {
        t.revoked_at.or_else(|| match &t.principal {
            Principal::Bot(b) => self.bots.get(b).and_then(|b| b.archived_at),
            Principal::Member(_) => None,
        })
    }

    /// The number of live (not revoked) tokens of `principal`.
    pub fn live_token_count(&self, principal: &Principal) -> usize {
        self.identity_index.live_tokens.get(principal).map_or(0, BTreeSet::len)
    }

    /// The number of bots of `member_id` that are not archived.
    pub fn live_bot_count(&self, member_id: &str) -> usize {
        self.identity_index.live_bots.get(member_id).copied().unwrap_or(0)
    }

    /// The member with this e-mail, if any.
    pub(crate) fn member_by_email(&self, email: &str) -> Option<&String> {
        self.identity_index.emails.get(email)
    }

    /// The provider with this name, if any.
    pub(crate) fn provider_by_name(&self, name: &str) -> Option<&String> {
        self.identity_index.provider_names.get(name)
    }

    /// Records a new member.
    pub(crate) fn insert_member(&mut self, m: &Member) {
        if let Some(email) = &m.email {
            self.identity_index.emails.insert(email.clone(), m.id.clone());
        }
        self.members.insert(m.id.clone(), m.clone());
    }

    /// Records a new provider.
    pub(crate) fn insert_provider(&mut self, p: &Provider) {
        self.identity_index.provider_names.insert(p.name.clone(), p.id.clone());
        self.providers.insert(p.id.clone(), p.clone());
    }

    /// Records a new (live) bot.
    pub(crate) fn insert_bot(&mut self, b: &Bot) {
        if b.archived_at.is_none() {
            *self.identity_index.live_bots.entry(b.member_id.clone()).or_default() += 1;
        }
        self.bots.insert(b.id.clone(), b.clone());
    }

    /// Forgets a bot just inserted (its create was refused after all).
    pub(crate) fn uninsert_bot(&mut self, id: &str) {
        let Some(b) = self.bots.remove(id) else { return };
        if b.archived_at.is_none() {
            self.drop_live_bot(&b.member_id);
        }
    }

    fn drop_live_bot(&mut self, member_id: &str) {
        if let Some(n) = self.identity_index.live_bots.get_mut(member_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.identity_index.live_bots.remove(member_id);
            }
        }
    }

    /// Marks bot `id` archived at `at_ms` (once): its tokens that still worked stop now, and
    /// count from now for retention. Costs the bot's live tokens (at most
    /// `MAX_TOKENS_PER_PRINCIPAL`), never a walk over all tokens.
    pub(crate) fn mark_bot_archived(&mut self, id: &str, at_ms: u64) {
        let Some(b) = self.bots.get_mut(id) else { return };
        if b.archived_at.is_some() {
            return;
        }
        b.archived_at = Some(at_ms);
        let member = b.member_id.clone();
        self.drop_live_bot(&member);
        let principal = Principal::Bot(id.to_string());
        let tokens = self.identity_index.live_tokens.get(&principal).cloned().unwrap_or_default();
        for t in tokens {
            self.identity_index.dead_tokens.insert((at_ms, t));
        }
    }

    /// Records a new token (and its hash).
    pub(crate) fn insert_token(&mut self, token: &Token) {
        if token.revoked_at.is_none() {
            self.identity_index.live_tokens.entry(token.principal.clone()).or_default().insert(token.id.clone());
        }
        if let Some(at) = self.token_dead_at(token) {
            self.identity_index.dead_tokens.insert((at, token.id.clone()));
        }
        self.token_by_hash.insert(token.hash.clone(), token.id.clone());
        self.tokens.insert(token.id.clone(), token.clone());
    }

    /// Marks token `id` revoked at `at_ms` (once).
    pub(crate) fn mark_token_revoked(&mut self, id: &str, at_ms: u64) {
        let Some(t) = self.tokens.get(id) else { return };
        if t.revoked_at.is_some() {
            return;
        }
        let before = self.token_dead_at(t);
        let principal = t.principal.clone();
        if let Some(t) = self.tokens.get_mut(id) {
            t.revoked_at = Some(at_ms);
        }
        if let Some(at) = before {
            self.identity_index.dead_tokens.remove(&(at, id.to_string()));
        }
        self.identity_index.dead_tokens.insert((at_ms, id.to_string()));
        self.unlive_token(&principal, id);
    }

    fn unlive_token(&mut self, principal: &Principal, id: &str) {
        if let Some(ids) = self.identity_index.live_tokens.get_mut(principal) {
            ids.remove(id);
            if ids.is_empty() {
                self.identity_index.live_tokens.remove(principal);
            }
        }
    }

    /// Forgets a dead token past the retention: its record, its hash, its index entries.
    pub(crate) fn compact_token(&mut self, at: u64, id: &str) {
        self.identity_index.dead_tokens.remove(&(at, id.to_string()));
        let Some(t) = self.tokens.remove(id) else { return };
        if self.token_by_hash.get(&t.hash).is_some_and(|named| named == id) {
            self.token_by_hash.remove(&t.hash);
        }
        self.unlive_token(&t.principal, id);
    }
}
