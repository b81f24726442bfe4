//! The contract every sandbox provider adapter implements.
//!
//! Contract: an adapter makes exactly one attempt per call. It never retries, and it never
//! resumes (or otherwise changes) a sandbox on its own. It says precisely how a call ended:
//! before anything was sent ([`ProviderError::NotSent`]), answered with a refusal
//! ([`ProviderError::Rejected`]), or sent without a usable answer ([`ProviderError::Lost`]). Only
//! the last leaves the outcome unknown. Calls may be cancelled by the caller's deadline, which
//! the caller then treats as [`ProviderError::Lost`].

use async_trait::async_trait;

/// What a create needs to know.
#[derive(Debug, Clone)]
pub struct CreateSpec {
    /// The Computer id (adapters label sandboxes with it, so an inspection can find them).
    pub computer_id: String,
    /// The command key of the create (also a label).
    pub command_key: String,
    /// The template/image, if any.
    pub template: Option<String>,
    /// Whether a desktop is wanted.
    pub desktop: bool,
    /// The one-time code the sandbox's agent pairs with (providers that start our agent).
    pub pairing_code: Option<String>,
    /// The first UID of the Computer's own binding-UID range (allocated in the store for
    /// providers whose sandboxes share a kernel), handed to its agent.
    pub first_uid: Option<u32>,
}

/// How a provider call failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ProviderError {
    /// Nothing was sent: the call had no effect.
    #[error("not sent: {0}")]
    NotSent(String),
    /// The provider answered and refused: the call had no effect.
    #[error("rejected by the provider: {0}")]
    Rejected(String),
    /// Sent, but the answer was lost or came too late: the effect is unknown.
    #[error("answer lost: {0}")]
    Lost(String),
}

/// What an inspection finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    /// The provider's reference.
    pub sandbox: String,
    /// The provider's state name.
    pub state: String,
}

/// A sandbox provider adapter.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Creates a sandbox; answers its reference.
    async fn create(&self, spec: &CreateSpec) -> Result<String, ProviderError>;
    /// Pauses a sandbox (memory and processes kept where the provider can). `command_key` is
    /// the execution's key (with the sandbox, it names this effect: an adapter may pass it on
    /// as the provider's idempotency key).
    async fn pause(&self, sandbox: &str, command_key: &str) -> Result<(), ProviderError>;
    /// Resumes a paused sandbox.
    async fn resume(&self, sandbox: &str, command_key: &str) -> Result<(), ProviderError>;
    /// Deletes a sandbox and its files.
    async fn delete(&self, sandbox: &str, command_key: &str) -> Result<(), ProviderError>;
    /// Looks up the sandbox of a Computer (by its labels), to settle an unknown outcome.
    async fn inspect(&self, computer_id: &str) -> Result<Option<SandboxInfo>, ProviderError>;
    /// The reference a Computer's sandbox has when none was recorded (a create whose answer was
    /// lost and then decided succeeded), if the provider names sandboxes deterministically.
    fn reference_of(&self, _computer_id: &str) -> Option<String> {
        None
    }
    /// Every sandbox the provider holds for any Computer, by Computer id (`None`: the provider
    /// cannot list them, so vanished sandboxes are not watched for).
    async fn list(&self) -> Result<Option<std::collections::HashMap<String, SandboxInfo>>, ProviderError> {
        Ok(None)
    }
}

/// The adapter of a provider kind that this build cannot drive yet: every call fails before
/// anything is sent, so executions fail cleanly and the Computer stays.
pub struct Unavailable(pub String);

#[async_trait]
impl Provider for Unavailable {
    async fn create(&self, _spec: &CreateSpec) -> Result<String, ProviderError> {
        Err(ProviderError::NotSent(self.0.clone()))
    }
    async fn pause(&self, _sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        Err(ProviderError::NotSent(self.0.clone()))
    }
    async fn resume(&self, _sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        Err(ProviderError::NotSent(self.0.clone()))
    }
    async fn delete(&self, _sandbox: &str, _command_key: &str) -> Result<(), ProviderError> {
        Err(ProviderError::NotSent(self.0.clone()))
    }
    async fn inspect(&self, _computer_id: &str) -> Result<Option<SandboxInfo>, ProviderError> {
        Err(ProviderError::NotSent(self.0.clone()))
    }
}
