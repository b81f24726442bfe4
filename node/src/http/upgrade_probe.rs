//! `/v1/admin/upgrade-probe`, only in the `upgrade-probe` build (one store version ahead): `POST
//! {"note"}` proposes the one command that build adds (refused by the version gate until every
//! node speaks it); `GET` answers the notes this node applied. For the rolling-upgrade test.

use axum::Json;
use axum::extract::State;
use axum::routing::MethodRouter;
use computerd_raft::sm::Command;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::util::propose;

/// The route's methods.
pub fn routes() -> MethodRouter<AppState> {
    axum::routing::post(probe).get(notes)
}

async fn probe(State(state): State<AppState>, auth: Auth, Json(body): Json<Value>) -> Result<Json<Value>, ApiError> {
    auth.for_write(&state).await?.check_admin_write()?;
    let note = body["note"].as_str().unwrap_or_default().to_string();
    propose(&state, Command::UpgradeProbe { note: note.clone() }).await?;
    Ok(Json(json!({"note": note, "storeVersion": computerd_raft::sm::STORE_VERSION})))
}

async fn notes(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.current(&state).await?.check_admin_read()?;
    let notes: Vec<Value> = state
        .cluster
        .state()
        .read(|s| s.events.iter().filter(|e| e.kind == "UpgradeProbe").map(|e| e.data["note"].clone()).collect());
    Ok(Json(json!({"notes": notes, "storeVersion": computerd_raft::sm::STORE_VERSION})))
}
