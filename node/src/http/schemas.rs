//! The shapes the OpenAPI document names that no handler type carries: the error body and the
//! execution receipt. Handlers cite them in their annotations; `openapi.rs` lists them.

use utoipa::ToSchema;

/// Every error answer: `{"error": {"kind", "message", "errorId", "executionId"?}}`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorBody {
    /// The error.
    error: ErrorDetail,
}

/// The error inside [`ErrorBody`].
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "camelCase")]
pub struct ErrorDetail {
    /// `invalid_request`, `unauthorized`, `forbidden`, `not_found`, `conflict`, `unavailable`,
    /// `internal`, `ComputerConflict`, `IdempotencyKeyReused`, `ComputerUnsupported`, …
    kind: String,
    /// A message safe to show.
    message: String,
    /// The id under which the server logged it.
    error_id: String,
    /// For `ComputerConflict`: the running execution.
    execution_id: Option<String>,
}

/// An execution receipt.
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "camelCase")]
pub struct ReceiptDoc {
    /// `exe_…`
    execution_id: String,
    /// The caller's idempotency key.
    command_key: String,
    /// `create`, `pause`, `resume`, `delete`.
    kind: String,
    /// `pending`, `running`, `succeeded`, `failed`, `outcome_unknown`.
    state: String,
    /// `{"type": "computer", "id": "cmp_…"}`
    #[schema(value_type = Object)]
    resource: (),
    /// A paired create's one-time code (its requester only, once succeeded, for 10 minutes).
    pairing_code: Option<String>,
    /// The approval a pending execution waits for.
    approval_id: Option<String>,
}
