//! The API description and the Rust client against a real node.

use computerd_client::Client;
use computerd_client::NewComputer;
use computerd_client::Source;
use computerd_tests::TestCluster;
use reqwest::Method;
use serde_json::json;

/// `/v1/openapi.json` describes every route with its methods, the bearer scheme, and the
/// request bodies derived from the handlers' types.
#[tokio::test]
async fn t10_openapi_describes_every_route() {
    let c = TestCluster::start(1).await;
    let doc: serde_json::Value =
        c.http.get(c.url(1, "/v1/openapi.json")).send().await.expect("send").json().await.expect("json");
    let routes = [
        ("/v1/health", "get"),
        ("/v1/members", "post"),
        ("/v1/members", "get"),
        ("/v1/bots", "post"),
        ("/v1/bots/{id}/archive", "post"),
        ("/v1/tokens", "post"),
        ("/v1/tokens/{id}", "delete"),
        ("/v1/cluster/nodes/{id}", "delete"),
        ("/v1/computer-providers", "post"),
        ("/v1/computer-providers", "get"),
        ("/v1/computers", "post"),
        ("/v1/computers", "get"),
        ("/v1/computers/{id}", "get"),
        ("/v1/computers/{id}", "delete"),
        ("/v1/computers/{id}/pause", "post"),
        ("/v1/computers/{id}/resume", "post"),
        ("/v1/computers/{id}/stop", "post"),
        ("/v1/computers/{id}/usage", "get"),
        ("/v1/computers/{id}/acquire", "post"),
        ("/v1/computers/{id}/release", "post"),
        ("/v1/computers/{id}/bots", "get"),
        ("/v1/computers/{id}/bots/{bot}", "put"),
        ("/v1/computers/{id}/bots/{bot}", "delete"),
        ("/v1/executions/{id}", "get"),
        ("/v1/executions/{id}/decision", "post"),
        ("/v1/events", "get"),
        ("/v1/approvals", "get"),
        ("/v1/approvals/{id}", "post"),
        ("/v1/capability-rules", "put"),
        ("/v1/retention", "get"),
        ("/v1/retention", "put"),
    ];
    for (path, method) in routes {
        assert!(doc["paths"][path][method].is_object(), "{method} {path} is not described");
    }
    let create = &doc["components"]["schemas"]["NewComputer"];
    assert_eq!(create["required"], json!(["commandKey", "source"]));
    assert_eq!(create["additionalProperties"], false);
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
}

/// The document is valid OpenAPI, as a maintained validator from PyPI
/// (`openapi-spec-validator`, installed by `.ci/run`) reads it.
#[tokio::test]
async fn t15_the_document_passes_openapi_spec_validator() {
    let c = TestCluster::start(1).await;
    let doc = c.http.get(c.url(1, "/v1/openapi.json")).send().await.expect("send").text().await.expect("text");
    let file = c.dir.path().join("openapi.json");
    std::fs::write(&file, &doc).expect("write the document");
    let out = std::process::Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(&file)
        .output()
        .expect("python3 (CI installs openapi-spec-validator with pip)");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "openapi-spec-validator refused the document: {said}");
    assert!(said.contains("OK"), "{said}");
}

/// The client prepares a command key once; sending the same prepared command again (as after a
/// lost answer) answers the same receipt, and the API errors come back typed.
#[tokio::test]
async fn t20_client_send_is_safe_to_repeat() {
    let c = TestCluster::start_fake(1).await;
    let (_, p) =
        c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(json!({"kind": "fake", "name": "p"}))).await;
    let provider = p["id"].as_str().expect("provider").to_string();
    let client = Client::new(c.url(1, ""), c.token.clone());
    let create = client.computers().create(NewComputer::new(Source::provider(provider)));
    let first = create.send().await.expect("send");
    let again = create.send().await.expect("send again");
    assert_eq!(first.execution_id, again.execution_id);
    assert_eq!(first.command_key, create.command_key());
    let done = client.wait_execution(&first.execution_id, std::time::Duration::from_secs(30)).await.expect("wait");
    assert_eq!(done.state, "succeeded");
    let other = client.computers().pause("cmp_nope");
    match other.send().await {
        Err(computerd_client::Error::Api { status, kind, error_id, .. }) => {
            assert_eq!((status, kind.as_str()), (404, "not_found"));
            assert!(error_id.starts_with("err_"));
        }
        r => panic!("expected a 404, got {r:?}"),
    }
}
