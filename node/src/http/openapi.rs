//! The OpenAPI description of the API, generated from the route handlers and request types
//! (utoipa) and served at `GET /v1/openapi.json`.

use axum::Json;
use utoipa::Modify;
use utoipa::OpenApi;
use utoipa::openapi::security::HttpAuthScheme;
use utoipa::openapi::security::HttpBuilder;
use utoipa::openapi::security::SecurityScheme;

use super::agent;
use super::approvals;
use super::backup;
use super::blobs;
use super::bot_tools;
use super::browser;
use super::computers;
use super::copies;
use super::delegations;
use super::desktop;
use super::desktop_stream;
use super::egress;
use super::events;
use super::executions;
use super::files;
use super::grants;
use super::health;
use super::identity;
use super::mcp;
use super::metrics;
use super::org_limits;
use super::ports;
use super::providers;
use super::retention;
use super::runs;
use super::secrets;
use super::sessions;
use super::tools;

use super::schemas::ErrorBody;
use super::schemas::ErrorDetail;
use super::schemas::ReceiptDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(title = "computerd", description = "The control plane for AI bots' computers."),
    paths(
        health::health, health::remove_node, health::join_token, backup::backup, metrics::scrape,
        identity::create_member, identity::list_members, identity::create_bot, identity::list_bots,
        identity::archive_bot, identity::create_token, identity::list_tokens, identity::revoke_token,
        providers::create, providers::list,
        computers::create, computers::list, computers::get, computers::pause, computers::resume, computers::recreate,
        computers::delete, computers::stop, computers::usage, computers::sandbox, computers::acquire, computers::release,
        grants::put, grants::get, grants::list, grants::delete,
        secrets::put, secrets::get, secrets::list, secrets::delete,
        egress::put, egress::get,
        delegations::create, delegations::list, delegations::end,
        executions::get, executions::decide,
        events::events,
        approvals::list, approvals::decide, approvals::get_rules, approvals::put_rules,
        retention::get, retention::put,
        org_limits::get, org_limits::put,
        bot_tools::list, bot_tools::call,
        mcp::mcp_post, mcp::mcp_get, mcp::mcp_delete,
        sessions::start, sessions::list, sessions::get, sessions::output, sessions::input, sessions::resize, sessions::stop,
        files::read, files::write, files::remove, files::edit, files::directory,
        desktop::status, desktop::screenshot, desktop::actions, desktop::release,
        copies::to_box, copies::from_box,
        blobs::put, blobs::get, blobs::info, blobs::limits, blobs::set_limits,
        runs::turn, runs::claim, runs::get, runs::renew, runs::post_event, runs::finish, runs::cancel, runs::decide, runs::events,
        browser::open, browser::list, browser::close, browser::navigate, browser::snapshot, browser::click,
        browser::hover, browser::type_text, browser::press, browser::select, browser::upload, browser::evidence, browser::screenshot,
        browser::session_status, browser::dialog, browser::fill_secret, browser::action, browser::decide,
        desktop_stream::stream, desktop_stream::view, desktop_stream::asset, desktop_stream::websocket,
        ports::put, ports::list, ports::get, ports::delete,
        agent::pair, agent::link, agent::pool,
        tools::install, tools::list, tools::discover, tools::call, tools::switch, tools::revoke, tools::model_tool,
    ),
    components(schemas(ErrorBody, ErrorDetail, ReceiptDoc)),
    modifiers(&BearerAuth),
)]
pub struct ApiDoc;

/// `GET /v1/openapi.json`
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

/// The API reference as Markdown (`docs/api.md`), made from the OpenAPI document.
#[cfg(test)]
mod reference {
    use std::fmt::Write;

    use serde_json::Value;

    /// A schema's type, in words: `string`, `integer`, `string | null`, a component's name, a
    /// list of one.
    fn type_of(s: &Value) -> String {
        if let Some(r) = s["$ref"].as_str() {
            return r.rsplit('/').next().unwrap_or(r).to_string();
        }
        if let Some(e) = s["enum"].as_array() {
            let names: Vec<String> = e.iter().map(|v| format!("`{}`", v.as_str().unwrap_or_default())).collect();
            return names.join(" \\| ");
        }
        for k in ["oneOf", "anyOf", "allOf"] {
            if let Some(all) = s[k].as_array() {
                let names: Vec<String> = all.iter().map(type_of).collect();
                return names.join(" \\| ");
            }
        }
        let base = match &s["type"] {
            Value::String(t) => t.clone(),
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" \\| "),
            _ => "any".into(),
        };
        if base == "array" { format!("list of {}", type_of(&s["items"])) } else { base }
    }

    /// One line of a table cell: newlines and pipes would break the table.
    fn cell(s: &str) -> String {
        s.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
    }

    /// What an operation does: its doc comment without the route it repeats.
    fn what(op: &Value) -> String {
        let summary = op["summary"].as_str().unwrap_or_default();
        let rest = match summary.strip_prefix('`').and_then(|s| s.split_once('`')) {
            Some((_, after)) => after.trim_start_matches(':').trim().to_string(),
            None => summary.to_string(),
        };
        let description = op["description"].as_str().unwrap_or_default();
        let text = [rest.as_str(), description].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>().join(" ");
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut chars = text.chars();
        chars.next().map(|c| c.to_uppercase().chain(chars).collect()).unwrap_or_default()
    }

    fn resolve<'a>(doc: &'a Value, s: &'a Value) -> &'a Value {
        match s["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/schemas/")) {
            Some(name) => &doc["components"]["schemas"][name],
            None => s,
        }
    }

    /// The reference: an index, then each tag's operations with their parameters, body and
    /// answers.
    pub fn markdown(doc: &Value) -> String {
        let mut by_tag: std::collections::BTreeMap<String, Vec<(String, String, &Value)>> = Default::default();
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for (method, op) in item.as_object().into_iter().flatten() {
                let tag = op["tags"][0].as_str().unwrap_or("other").to_string();
                by_tag.entry(tag).or_default().push((path.clone(), method.to_uppercase(), op));
            }
        }
        let mut out = String::new();
        out.push_str("# The API reference\n\n");
        out.push_str(
            "Made from the OpenAPI document that every node serves at `GET /v1/openapi.json` (a test keeps this \
             file equal to it). Every route takes `Authorization: Bearer <token>` but those marked *open*. \
             Errors are `{\"error\": {\"kind\", \"message\", \"errorId\"}}` with the status and kind each \
             operation lists.\n\n",
        );
        for (tag, ops) in &by_tag {
            let _ = writeln!(
                out,
                "- [{tag}](#{tag}): {}",
                ops.iter().map(|(p, m, _)| format!("`{m} {p}`")).collect::<Vec<_>>().join(", ")
            );
        }
        for (tag, ops) in &by_tag {
            let _ = write!(out, "\n## {tag}\n");
            for (path, method, op) in ops {
                let open = op["security"].as_array().is_none_or(|s| s.iter().all(|r| r.get("bearer").is_none()));
                let _ = write!(out, "\n### `{method} {path}`{}\n\n", if open { " (open)" } else { "" });
                let what = what(op);
                if !what.is_empty() {
                    let _ = writeln!(out, "{what}\n");
                }
                let params: Vec<&Value> = op["parameters"].as_array().into_iter().flatten().collect();
                if !params.is_empty() {
                    out.push_str("| parameter | in | type | |\n|---|---|---|---|\n");
                    for p in params {
                        let _ = writeln!(
                            out,
                            "| `{}`{} | {} | {} | {} |",
                            p["name"].as_str().unwrap_or_default(),
                            if p["required"] == true { "" } else { "?" },
                            p["in"].as_str().unwrap_or_default(),
                            type_of(&p["schema"]),
                            cell(p["description"].as_str().unwrap_or_default())
                        );
                    }
                    out.push('\n');
                }
                if let Some((kind, content)) = op["requestBody"]["content"].as_object().and_then(|c| c.iter().next()) {
                    let schema = resolve(doc, &content["schema"]);
                    let required: Vec<&str> =
                        schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                    let body_what = cell(
                        op["requestBody"]["description"]
                            .as_str()
                            .unwrap_or(schema["description"].as_str().unwrap_or_default()),
                    );
                    let _ = writeln!(
                        out,
                        "Body (`{kind}`){}\n",
                        if body_what.is_empty() { String::new() } else { format!(": {body_what}") }
                    );
                    if let Some(props) = schema["properties"].as_object().filter(|p| !p.is_empty()) {
                        out.push_str("| field | type | |\n|---|---|---|\n");
                        for (name, p) in props {
                            let opt = if required.contains(&name.as_str()) { "" } else { "?" };
                            let p = resolve(doc, p);
                            let _ = writeln!(
                                out,
                                "| `{name}`{opt} | {} | {} |",
                                type_of(p),
                                cell(p["description"].as_str().unwrap_or_default())
                            );
                        }
                        out.push('\n');
                    }
                }
                out.push_str("| answer | |\n|---|---|\n");
                for (status, r) in op["responses"].as_object().into_iter().flatten() {
                    let _ = writeln!(out, "| {status} | {} |", cell(r["description"].as_str().unwrap_or_default()));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The document describes exactly the routes the router serves (the router is built from
    /// the same table, `http::routes`), each operation with an id of its own.
    #[test]
    fn the_document_describes_every_route_of_the_router_and_nothing_else() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
        let mut described = BTreeSet::new();
        let mut ids = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("a path item") {
                described.insert((method.clone(), path.clone()));
                ids.push(op["operationId"].as_str().unwrap_or_default().to_string());
            }
        }
        let served: BTreeSet<(String, String)> = super::super::routes()
            .into_iter()
            .filter(|(_, p)| *p != "/v1/openapi.json") // the document itself
            // A catch-all (`{*file}`: noVNC's files) is a plain parameter in the document.
            .map(|(m, p)| (m.to_string(), p.replace("{*", "{")))
            .collect();
        let undocumented: Vec<_> = served.difference(&described).collect();
        let unserved: Vec<_> = described.difference(&served).collect();
        assert!(undocumented.is_empty(), "routes the document does not describe: {undocumented:?}");
        assert!(unserved.is_empty(), "operations the router does not serve: {unserved:?}");
        let unique: BTreeSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "operationIds repeat: {ids:?}");
        assert!(ids.iter().all(|id| !id.is_empty()), "an operation without an id: {ids:?}");
    }

    /// `docs/api.md`, the API reference, is made from this document, so it names exactly the
    /// routes the router serves, each with its parameters, body and answers. After a change of
    /// the API, `COMPUTERD_BLESS=1 cargo test -p computerd-node --lib api_reference` writes it
    /// again.
    #[test]
    fn the_api_reference_in_docs_is_made_from_the_document() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
        let made = super::reference::markdown(&doc);
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api.md");
        if std::env::var_os("COMPUTERD_BLESS").is_some() {
            std::fs::write(&path, &made).expect("write docs/api.md");
        }
        let kept = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            kept == made,
            "docs/api.md is not the reference the document makes: run COMPUTERD_BLESS=1 cargo test -p computerd-node --lib api_reference"
        );
    }

    /// Every route that README.md and the docs name (`POST /v1/…`, `GET …/files`, and each
    /// `curl` line's method and path) is one the router serves with that method, so the prose
    /// cannot drift from the API (`docs/api.md` is made from the document and not read here).
    #[test]
    fn every_route_the_docs_name_is_served() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = vec![root.join("README.md")];
        let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
            .expect("docs/")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "md") && !p.ends_with("api.md"))
            .collect();
        docs.sort();
        files.extend(docs);
        let served: Vec<(String, Vec<String>)> = super::super::routes()
            .into_iter()
            .map(|(m, p)| (m.to_string(), p.split('/').filter(|s| !s.is_empty()).map(String::from).collect()))
            .collect();
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
        let mut named = 0;
        let mut bodies = 0;
        let mut stale = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).expect("a doc");
            let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            for (line_no, methods, mention, body) in docs_routes::mentions_with_bodies(&text) {
                for path in docs_routes::expand(&mention) {
                    let Some(segments) = docs_routes::segments(&path) else { continue };
                    named += 1;
                    for m in &methods {
                        let Some((_, route)) =
                            served.iter().find(|(sm, sp)| sm == m && docs_routes::matches(&segments, sp))
                        else {
                            stale.push(format!("{name}:{line_no}: {} {path}", m.to_uppercase()));
                            continue;
                        };
                        // A JSON body shown with it: its fields are the operation's.
                        let Some(body) = body.as_ref().and_then(|b| b.as_object()) else { continue };
                        let key = format!("/{}", route.join("/")).replace("{*", "{");
                        let op = &doc["paths"][key.as_str()][m.as_str()];
                        let schema = op["requestBody"]["content"]["application/json"]["schema"].clone();
                        let schema = match schema["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/schemas/"))
                        {
                            Some(n) => doc["components"]["schemas"][n].clone(),
                            None => schema,
                        };
                        let Some(props) = schema["properties"].as_object() else { continue };
                        bodies += 1;
                        for k in body.keys().filter(|k| !props.contains_key(*k)) {
                            stale.push(format!(
                                "{name}:{line_no}: {} {path}: no field {k:?} in its body",
                                m.to_uppercase()
                            ));
                        }
                        for r in schema["required"].as_array().into_iter().flatten().filter_map(|r| r.as_str()) {
                            if !body.contains_key(r) {
                                stale.push(format!(
                                    "{name}:{line_no}: {} {path}: its body lacks {r:?}",
                                    m.to_uppercase()
                                ));
                            }
                        }
                    }
                }
            }
        }
        assert!(named > 100, "the docs name routes ({named} found): the scan itself works");
        assert!(bodies >= 5, "the docs show request bodies ({bodies} checked): the scan itself works");
        assert!(stale.is_empty(), "routes the docs name that the router does not serve:\n{}", stale.join("\n"));
    }

    /// Every route takes its caller's token, but the health check, pairing, the agent's link
    /// (which authenticate otherwise) and the document.
    #[test]
    fn every_operation_but_the_open_ones_needs_the_bearer_token() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
        // A person's stream: its ticket (single-use), then its cookie, never a bearer token.
        let open = [
            "/v1/health",
            "/v1/agent/pair",
            "/v1/agent/link",
            "/v1/agent/pool",
            "/v1/computers/{id}/desktop/view",
            "/v1/computers/{id}/desktop/view/{file}",
            "/v1/computers/{id}/desktop/websockify",
        ];
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("a path item") {
                let bearer = op["security"].as_array().is_some_and(|s| s.iter().any(|r| r.get("bearer").is_some()));
                assert_eq!(bearer, !open.contains(&path.as_str()), "{method} {path}: {op}");
            }
        }
    }
}

/// Finding the routes that prose names (for the docs test above).
#[cfg(test)]
mod docs_routes {
    const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

    /// (line number, methods in lower case, path) of each `METHOD[/METHOD] /path` (or
    /// `METHOD …/tail`) and each `curl` command (its lines joined) in `text`.
    pub fn mentions(text: &str) -> Vec<(usize, Vec<String>, String)> {
        mentions_with_bodies(text).into_iter().map(|(n, m, p, _)| (n, m, p)).collect()
    }

    /// [`mentions`], with each `curl` command's body when it is JSON (`-d '{…}'`).
    pub fn mentions_with_bodies(text: &str) -> Vec<(usize, Vec<String>, String, Option<serde_json::Value>)> {
        let mut out = Vec::new();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i];
            let start = i + 1;
            let words: Vec<&str> =
                line.split(|c: char| c.is_whitespace() || c == '`').filter(|w| !w.is_empty()).collect();
            for pair in words.windows(2) {
                let methods: Vec<&str> = pair[0].trim_start_matches(['(', '"']).split('/').collect();
                if methods.iter().all(|m| METHODS.contains(m)) && (pair[1].starts_with('/') || pair[1].starts_with('…'))
                {
                    out.push((start, methods.iter().map(|m| m.to_lowercase()).collect(), pair[1].to_string(), None));
                }
            }
            if line.trim_start().starts_with("curl ") {
                let mut cmd = line.to_string();
                while cmd.trim_end().ends_with('\\') && i + 1 < lines.len() {
                    i += 1;
                    cmd = format!("{} {}", cmd.trim_end().trim_end_matches('\\'), lines[i]);
                }
                if let Some(c) = curl(&cmd) {
                    out.push((start, vec![c.0], c.1, json_body(&cmd)));
                }
            }
            i += 1;
        }
        out
    }

    /// The JSON body of a curl command: the single-quoted argument of `-d`/`--data`/`--json`.
    fn json_body(cmd: &str) -> Option<serde_json::Value> {
        let at = [" -d '", " --data '", " --json '"].iter().filter_map(|f| cmd.find(f).map(|i| i + f.len())).min()?;
        let end = cmd[at..].find('\'')?;
        serde_json::from_str(&cmd[at..at + end]).ok()
    }

    /// A curl command's method and the path of its URL on a node (`http(s)://host/…`, `$URL/…`).
    fn curl(cmd: &str) -> Option<(String, String)> {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let mut method = None;
        let mut body = false;
        let mut path = None;
        for (i, w) in words.iter().enumerate() {
            match *w {
                "-X" | "--request" => method = words.get(i + 1).map(|m| m.trim_matches(['\'', '"']).to_lowercase()),
                "-d" | "--data" | "--data-binary" | "-F" | "-T" | "--upload-file" | "--json" => body = true,
                _ => {}
            }
            let w = w.trim_matches(['\'', '"']);
            let after_host = if let Some(rest) = w.strip_prefix("http://").or_else(|| w.strip_prefix("https://")) {
                rest.find('/').map(|at| &rest[at..])
            } else if w.starts_with('$') {
                w.find('/').map(|at| &w[at..])
            } else {
                None
            };
            if let Some(p) = after_host.filter(|p| p.starts_with("/v1/") || p.starts_with("/api/") || *p == "/mcp") {
                path = Some(p.to_string());
            }
        }
        let method = method.unwrap_or_else(|| if body { "post".into() } else { "get".into() });
        Some((method, path?))
    }

    /// The path's segments, without its query, fragment or trailing punctuation; `None` when it
    /// is not a route of computerd's API (a sandbox's own page, a file path). A leading `…`
    /// keeps a `…` segment: the path is then a tail of a route.
    pub fn segments(path: &str) -> Option<Vec<String>> {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let path = path.trim_end_matches(['.', ',', ':', ';', ')', '"', '\'']);
        let segs: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(String::from).collect();
        let first = segs.first()?;
        let api = ["v1", "api", "mcp", "metrics"].contains(&first.as_str()) || first == "…" || first == "...";
        api.then_some(segs)
    }

    /// Whether a named path's segments fit a route's: literal segments equal, a route's
    /// `{param}` taking any one segment (and `{*rest}` the rest); a leading `…` fits any head.
    pub fn matches(named: &[String], route: &[String]) -> bool {
        let (tail, named) = match named.first().map(String::as_str) {
            Some("…" | "...") => (true, &named[1..]),
            _ => (false, named),
        };
        let fits = |n: &[String], r: &[String]| {
            let rest = r.last().is_some_and(|s| s.starts_with("{*"));
            if rest && n.len() >= r.len() {
                return n.iter().zip(&r[..r.len() - 1]).all(|(a, b)| seg(a, b));
            }
            n.len() == r.len() && n.iter().zip(r).all(|(a, b)| seg(a, b))
        };
        if tail { (0..route.len()).any(|skip| fits(named, &route[skip..])) } else { fits(named, route) }
    }

    /// A route's parameter takes any segment; a placeholder of the prose (`<tool>`, `:id`,
    /// `{id}`, `$ID`, `cmp_…`) stands for any one segment.
    fn seg(named: &str, route: &str) -> bool {
        let placeholder = named.starts_with(['<', ':', '{', '$']) || named.contains('…');
        route.starts_with('{') || placeholder || named == route
    }

    /// A path with one brace list (`…/browser/{click,type}`), as the paths it stands for.
    pub fn expand(path: &str) -> Vec<String> {
        if let (Some(open), Some(close)) = (path.find('{'), path.find('}'))
            && open < close
            && path[open..close].contains(',')
        {
            return path[open + 1..close]
                .split(',')
                .map(|alt| format!("{}{}{}", &path[..open], alt.trim(), &path[close + 1..]))
                .collect();
        }
        vec![path.to_string()]
    }

    #[test]
    fn mentions_and_matching() {
        let text = "Send `POST /v1/approvals/:id` with `GET/POST …/files?path=x`.\n    curl -s -H 'a: b' \\\n        http://127.0.0.1:8080/v1/computers/$ID/sessions -d '{}'\n`GET /` of the site";
        let m = mentions(text);
        assert_eq!(m.len(), 4, "{m:?}");
        assert_eq!(segments(&m[3].2), None, "`GET /` of a site is not the API");
        assert_eq!((m[0].0, m[0].1.clone(), m[0].2.as_str()), (1, vec!["post".to_string()], "/v1/approvals/:id"));
        assert_eq!(m[1].1, vec!["get".to_string(), "post".to_string()]);
        assert_eq!(
            (m[2].0, m[2].1.clone(), m[2].2.as_str()),
            (2, vec!["post".to_string()], "/v1/computers/$ID/sessions")
        );
        let route = |p: &str| p.split('/').filter(|s| !s.is_empty()).map(String::from).collect::<Vec<_>>();
        let named = |p: &str| segments(p).expect("an API path");
        assert!(matches(&named("/v1/approvals/:id"), &route("/v1/approvals/{id}")));
        assert!(!matches(&named("/v1/approvals"), &route("/v1/approvals/{id}")));
        assert!(matches(&named("…/files?path=x"), &route("/v1/computers/{id}/files")));
        assert!(!matches(&named("…/file"), &route("/v1/computers/{id}/files")));
        assert!(matches(
            &named("/v1/computers/{id}/desktop/view/core/rfb.js"),
            &route("/v1/computers/{id}/desktop/view/{*file}")
        ));
        assert_eq!(segments("/note.txt"), None, "not the API");
        assert!(matches(&named("…/browser/<tool>"), &route("/v1/computers/{id}/browser/click")), "a placeholder");
        assert_eq!(expand("…/browser/{click,type}"), vec!["…/browser/click", "…/browser/type"]);
        assert_eq!(expand("/v1/computers/{id}"), vec!["/v1/computers/{id}"]);
    }
}
