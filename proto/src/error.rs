//! The error kinds of the API and how each maps to an HTTP status and a gRPC code.

/// An error kind that callers can act on. Its string form is the `kind` field of an API error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is malformed or a field is invalid.
    InvalidRequest,
    /// No token, or a token that is unknown or revoked.
    Unauthorized,
    /// The caller is known but lacks the right.
    Forbidden,
    /// The resource does not exist, or the caller may not see it.
    NotFound,
    /// The request conflicts with the current state (e.g. a duplicate name).
    Conflict,
    /// The cluster cannot serve this right now (no leader, no quorum); retry later.
    Unavailable,
    /// A bug or an unexpected failure; the error id points at the server log.
    Internal,
    /// Another lifecycle execution holds the Computer; the error names it.
    ComputerConflict,
    /// The command key was already used with another request body.
    IdempotencyKeyReused,
    /// The Computer's source cannot do this (e.g. pausing an own machine).
    ComputerUnsupported,
    /// A call on a Computer failed; the error id points at the server log.
    ComputerExecutionFailed,
    /// A body or file is over its limit.
    TooLarge,
    /// A tool package (or its manifest) was refused; `reason` names why.
    PackageRejected,
    /// A call on a Computer did not end within its deadline (its owner did not answer in time).
    DeadlineExceeded,
    /// The route exists but does not take this method.
    MethodNotAllowed,
    /// Too many calls from this source or token; `Retry-After` says when to try again.
    RateLimited,
    /// Between node and agent: the call carried an older link generation than the agent's (the
    /// link was replaced). A caller that meets it may try again on the current link.
    StaleLink,
    /// Between nodes: this node does not hold the Computer's link (the answer names the owner
    /// it knows in [`crate::OWNER`]). The sending node goes there; callers never see it.
    NotOwner,
    /// What was asked for existed but is past its retention (a replayed tool call's result):
    /// it is gone, and nothing is done again.
    Expired,
    /// Someone else holds the Computer's input lease (a person in `control` mode, or another
    /// caller's desktop actions): the error names the holder.
    InputBusy,
    /// A browser ref no longer names the element it was taken from (the page navigated, the
    /// element was removed or re-rendered, or a newer snapshot replaced it): take a new snapshot.
    StaleRef,
    /// An upload's bytes do not hash to (or are not as long as) what the caller declared:
    /// nothing was stored.
    DigestMismatch,
    /// A run's action names a claim that no longer holds the run's lease (it lapsed, and
    /// another attempt may have claimed the run): nothing was sent.
    LeaseLost,
    /// A provider template's image cannot be a sandbox (missing, or without the agent, the
    /// `user` account or `/workspace`): nothing was created.
    TemplateInvalid,
    /// A browser navigation got no answer from the site: the name did not resolve, the
    /// connection was refused or timed out (a net error before any HTTP answer). The message
    /// names the net error and the host. A site's own 4xx or 5xx is an answer, not this.
    NavigationFailed,
}

impl ErrorKind {
    /// The `kind` string of the API error.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
            Self::ComputerConflict => "ComputerConflict",
            Self::IdempotencyKeyReused => "IdempotencyKeyReused",
            Self::ComputerUnsupported => "ComputerUnsupported",
            Self::ComputerExecutionFailed => "ComputerExecutionFailed",
            Self::TooLarge => "too_large",
            Self::PackageRejected => "package_rejected",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::RateLimited => "rate_limited",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::StaleLink => "stale_link",
            Self::NotOwner => "not_owner",
            Self::Expired => "expired",
            Self::InputBusy => "InputBusy",
            Self::StaleRef => "StaleRef",
            Self::DigestMismatch => "DigestMismatch",
            Self::LeaseLost => "LeaseLost",
            Self::TemplateInvalid => "template_invalid",
            Self::NavigationFailed => "navigation_failed",
        }
    }

    /// Parses the `kind` string back (used when an error crosses a node boundary).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "invalid_request" => Self::InvalidRequest,
            "unauthorized" => Self::Unauthorized,
            "forbidden" => Self::Forbidden,
            "not_found" => Self::NotFound,
            "conflict" => Self::Conflict,
            "unavailable" => Self::Unavailable,
            "internal" => Self::Internal,
            "ComputerConflict" => Self::ComputerConflict,
            "IdempotencyKeyReused" => Self::IdempotencyKeyReused,
            "ComputerUnsupported" => Self::ComputerUnsupported,
            "ComputerExecutionFailed" => Self::ComputerExecutionFailed,
            "too_large" => Self::TooLarge,
            "package_rejected" => Self::PackageRejected,
            "deadline_exceeded" => Self::DeadlineExceeded,
            "rate_limited" => Self::RateLimited,
            "method_not_allowed" => Self::MethodNotAllowed,
            "stale_link" => Self::StaleLink,
            "not_owner" => Self::NotOwner,
            "expired" => Self::Expired,
            "InputBusy" => Self::InputBusy,
            "StaleRef" => Self::StaleRef,
            "DigestMismatch" => Self::DigestMismatch,
            "LeaseLost" => Self::LeaseLost,
            "template_invalid" => Self::TemplateInvalid,
            "navigation_failed" => Self::NavigationFailed,
            _ => return None,
        })
    }

    /// The HTTP status code of this kind.
    pub fn http_status(self) -> u16 {
        match self {
            Self::InvalidRequest => 400,
            Self::Unauthorized => 401,
            Self::Forbidden => 403,
            Self::NotFound => 404,
            Self::Conflict => 409,
            Self::Unavailable => 503,
            Self::Internal => 500,
            Self::ComputerConflict => 409,
            Self::IdempotencyKeyReused => 422,
            Self::ComputerUnsupported => 422,
            Self::ComputerExecutionFailed => 502,
            Self::TooLarge => 413,
            Self::PackageRejected => 422,
            Self::DeadlineExceeded => 504,
            Self::RateLimited => 429,
            Self::MethodNotAllowed => 405,
            Self::StaleLink => 503,
            Self::NotOwner => 503,
            Self::Expired => 410,
            Self::InputBusy => 409,
            Self::StaleRef => 409,
            Self::DigestMismatch => 422,
            Self::LeaseLost => 409,
            Self::TemplateInvalid => 400,
            Self::NavigationFailed => 502,
        }
    }

    /// The gRPC status code of this kind.
    pub fn tonic_code(self) -> tonic::Code {
        match self {
            Self::InvalidRequest => tonic::Code::InvalidArgument,
            Self::Unauthorized => tonic::Code::Unauthenticated,
            Self::Forbidden => tonic::Code::PermissionDenied,
            Self::NotFound => tonic::Code::NotFound,
            Self::Conflict => tonic::Code::AlreadyExists,
            Self::Unavailable => tonic::Code::Unavailable,
            Self::Internal => tonic::Code::Internal,
            Self::ComputerConflict => tonic::Code::Aborted,
            Self::IdempotencyKeyReused => tonic::Code::FailedPrecondition,
            Self::ComputerUnsupported => tonic::Code::Unimplemented,
            Self::ComputerExecutionFailed => tonic::Code::Unavailable,
            Self::TooLarge => tonic::Code::ResourceExhausted,
            Self::PackageRejected => tonic::Code::InvalidArgument,
            Self::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            Self::RateLimited => tonic::Code::ResourceExhausted,
            Self::MethodNotAllowed => tonic::Code::Unimplemented,
            Self::StaleLink => tonic::Code::FailedPrecondition,
            Self::NotOwner => tonic::Code::FailedPrecondition,
            Self::Expired => tonic::Code::NotFound,
            Self::InputBusy => tonic::Code::Aborted,
            Self::StaleRef => tonic::Code::FailedPrecondition,
            Self::DigestMismatch => tonic::Code::DataLoss,
            Self::LeaseLost => tonic::Code::FailedPrecondition,
            Self::TemplateInvalid => tonic::Code::InvalidArgument,
            Self::NavigationFailed => tonic::Code::Unavailable,
        }
    }

    /// A gRPC status of this kind: its code, and the kind itself in [`ERROR_KIND`], so the
    /// receiver reads the kind from the code it carries, never from the message.
    pub fn status(self, message: impl Into<String>) -> tonic::Status {
        let mut s = tonic::Status::new(self.tonic_code(), message);
        s.metadata_mut().insert(ERROR_KIND, tonic::metadata::MetadataValue::from_static(self.as_str()));
        s
    }

    /// The kind a status carries in [`ERROR_KIND`] (`None`: a status made without one, e.g. by
    /// the transport).
    pub fn of(status: &tonic::Status) -> Option<Self> {
        status.metadata().get(ERROR_KIND).and_then(|v| v.to_str().ok()).and_then(Self::parse)
    }
}

/// The metadata key of a status's error kind (see [`ErrorKind::status`]).
pub const ERROR_KIND: &str = "x-computerd-kind";

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_map_to_statuses() {
        let all = [
            ErrorKind::InvalidRequest,
            ErrorKind::Unauthorized,
            ErrorKind::Forbidden,
            ErrorKind::NotFound,
            ErrorKind::Conflict,
            ErrorKind::Unavailable,
            ErrorKind::Internal,
            ErrorKind::ComputerConflict,
            ErrorKind::IdempotencyKeyReused,
            ErrorKind::ComputerUnsupported,
            ErrorKind::ComputerExecutionFailed,
            ErrorKind::TooLarge,
            ErrorKind::PackageRejected,
            ErrorKind::DeadlineExceeded,
            ErrorKind::RateLimited,
            ErrorKind::MethodNotAllowed,
            ErrorKind::StaleLink,
            ErrorKind::NotOwner,
            ErrorKind::Expired,
            ErrorKind::InputBusy,
            ErrorKind::StaleRef,
            ErrorKind::DigestMismatch,
            ErrorKind::LeaseLost,
            ErrorKind::TemplateInvalid,
            ErrorKind::NavigationFailed,
        ];
        for k in all {
            assert_eq!(ErrorKind::parse(k.as_str()), Some(k));
            assert!((400..600).contains(&k.http_status()), "{k}");
        }
        assert_eq!(ErrorKind::ComputerConflict.http_status(), 409);
        assert_eq!(ErrorKind::IdempotencyKeyReused.http_status(), 422);
        assert_eq!(ErrorKind::Forbidden.http_status(), 403);
        assert_eq!(ErrorKind::Unauthorized.http_status(), 401);
        assert_eq!(
            (ErrorKind::NavigationFailed.as_str(), ErrorKind::NavigationFailed.http_status()),
            ("navigation_failed", 502)
        );
        for k in all {
            let s = k.status("why");
            assert_eq!(ErrorKind::of(&s), Some(k));
            assert_eq!(s.code(), k.tonic_code());
        }
        // A status without the kind (from the transport) names none; the code alone decides then.
        assert_eq!(ErrorKind::of(&tonic::Status::failed_precondition("stale link generation")), None);
    }
}
