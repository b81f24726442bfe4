//! The bot tools (SPEC §3), each defined once: its name, what the model is told, the JSON Schema
//! of its arguments, and the API request a call becomes.
//!
//! A tool is a thin, declarative layer over the REST API: a call is turned into the API request
//! ([`BotTool::request`]) and sent through the node's own router in process, with the caller's
//! token (`http::bot_tools`). So every rule of the API holds for a tool call unchanged: the
//! caller's rights and token limits are checked on the node that serves it, capability deciders
//! decide (and a decision that cannot be made refuses, fail closed), calls on a Computer's agent
//! run on the node holding its link, and errors keep their kind. The same list is served as JSON
//! schemas (`GET /v1/tools?format=openai|anthropic`) and over MCP (`/mcp`); the desktop, browser
//! and run issues add their tools here.

use serde_json::Value;
use serde_json::json;

/// An API request made from a tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiCall {
    /// `GET`, `POST`, …
    pub method: &'static str,
    /// The path, its segments checked.
    pub path: String,
    /// The JSON body, if any.
    pub body: Option<Value>,
}

/// Why a tool call was refused before any request was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadArguments(pub String);

/// One bot tool.
pub struct BotTool {
    /// Its name, as the model calls it.
    pub name: &'static str,
    /// What the model is told it does.
    pub description: &'static str,
    /// The JSON Schema of its arguments (an object).
    pub parameters: fn() -> Value,
    /// The API request a call with these arguments becomes (the bot's id, when the caller is a
    /// bot, for the routes under `/api/bots/:botId`).
    pub request: fn(&Args, Option<&str>) -> Result<ApiCall, BadArguments>,
}

/// A tool call's arguments, read with checks.
pub struct Args<'a>(pub &'a Value);

impl Args<'_> {
    fn str(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    fn required(&self, key: &str) -> Result<&str, BadArguments> {
        self.str(key).filter(|s| !s.is_empty()).ok_or_else(|| BadArguments(format!("`{key}` is required")))
    }

    /// A non-negative integer for a query parameter (absent or null: `None`); nothing but digits
    /// can reach the query.
    fn uint(&self, key: &str) -> Result<Option<u64>, BadArguments> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                v.as_u64().map(Some).ok_or_else(|| BadArguments(format!("`{key}` must be a non-negative integer")))
            }
        }
    }

    /// The given integer keys of the arguments that are present, as a query string (`?a=1&b=2`,
    /// or empty).
    fn query(&self, keys: &[&str]) -> Result<String, BadArguments> {
        let mut parts = Vec::new();
        for key in keys {
            if let Some(v) = self.uint(key)? {
                parts.push(format!("{key}={v}"));
            }
        }
        Ok(if parts.is_empty() { String::new() } else { format!("?{}", parts.join("&")) })
    }

    /// An id of `prefix_…` for a path segment (nothing else can reach the path).
    fn id(&self, key: &str, prefix: &str) -> Result<&str, BadArguments> {
        let v = self.required(key)?;
        if crate::ids::is_id(v, prefix) {
            Ok(v)
        } else {
            Err(BadArguments(format!("`{key}` must be an id starting with {prefix}_")))
        }
    }

    /// The given keys of the arguments that are present, as a body (renamed where the API's
    /// name differs).
    fn pick(&self, keys: &[(&str, &str)]) -> Value {
        let mut body = serde_json::Map::new();
        for (from, to) in keys {
            if let Some(v) = self.0.get(*from).filter(|v| !v.is_null()) {
                body.insert((*to).to_string(), v.clone());
            }
        }
        Value::Object(body)
    }
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

const COMPUTER: &str = "The Computer's id (cmp_…), from openbot_computers_list.";

/// Every bot tool, in the order they are listed.
pub fn registry() -> &'static [BotTool] {
    &TOOLS
}

/// The tool named `name`.
pub fn find(name: &str) -> Option<&'static BotTool> {
    TOOLS.iter().find(|t| t.name == name)
}

static TOOLS: [BotTool; 11] = [
    BotTool {
        name: "openbot_computers_list",
        description: "Lists the Computers this bot may use, with their state.",
        parameters: || object(json!({}), &[]),
        request: |_, _| Ok(ApiCall { method: "GET", path: "/v1/computers".into(), body: None }),
    },
    BotTool {
        name: "openbot_computers_acquire",
        description: "Asks for the right to use an existing Computer. Granted at once, or waits for a person's \
                      approval (the answer says which).",
        parameters: || {
            object(
                json!({"computerId": {"type": "string", "description": COMPUTER},
                       "reason": {"type": "string", "description": "Why this bot needs it (shown to the person who decides)."}}),
                &["computerId"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            Ok(ApiCall {
                method: "POST",
                path: format!("/v1/computers/{id}/acquire"),
                body: Some(a.pick(&[("reason", "reason")])),
            })
        },
    },
    BotTool {
        name: "openbot_computers_create",
        description: "Creates a new sandbox Computer at a provider, owned by this bot's person. Answers a receipt \
                      (202): the Computer is `starting` until it runs. Sending the same commandKey again never \
                      makes a second one.",
        parameters: || {
            object(
                json!({
                    "commandKey": {"type": "string", "description": "Your key for this create (1-200 characters): a retry with the same key answers the same receipt."},
                    "name": {"type": "string"},
                    "provider": {"type": "string", "description": "The provider's id (cpp_…)."},
                    "template": {"type": "string", "description": "The provider's template, if not its default."},
                    "desktop": {"type": "boolean"},
                    "pauseAfter": {"type": ["integer", "null"], "description": "Seconds idle before it pauses (default 600; null: never)."},
                    "reason": {"type": "string", "description": "Why (shown to a person if one must approve)."}
                }),
                &["commandKey", "provider"],
            )
        },
        request: |a, _| {
            let provider = a.id("provider", "cpp")?;
            let mut body = a.pick(&[
                ("commandKey", "commandKey"),
                ("name", "name"),
                ("desktop", "desktop"),
                ("pauseAfter", "pauseAfter"),
                ("reason", "reason"),
            ]);
            a.required("commandKey")?;
            body["source"] = json!({"_tag": "Provider", "provider": provider, "template": a.str("template")});
            Ok(ApiCall { method: "POST", path: "/v1/computers".into(), body: Some(body) })
        },
    },
    BotTool {
        name: "openbot_computers_release",
        description: "Gives up this bot's right to a Computer; with `destroy`, deletes the Computer instead.",
        parameters: || {
            object(
                json!({"computerId": {"type": "string", "description": COMPUTER},
                       "destroy": {"type": "boolean", "description": "Delete the Computer (a capability a person may have to approve)."},
                       "commandKey": {"type": "string", "description": "With destroy: your key for the delete."}}),
                &["computerId"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let body = a.pick(&[("destroy", "destroy"), ("commandKey", "commandKey")]);
            Ok(ApiCall { method: "POST", path: format!("/v1/computers/{id}/release"), body: Some(body) })
        },
    },
    BotTool {
        name: "openbot_computer_exec",
        description: "Runs a shell command on a Computer (bash -lc, as `user` in /workspace) and answers its output \
                      up to yieldTimeMs. A command still running answers its session id: read its output later \
                      with openbot_computer_session_read, or type into it with openbot_computer_write_stdin.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "command": {"type": "string"},
                    "cwd": {"type": "string", "description": "Working directory (relative: from /workspace)."},
                    "tty": {"type": "boolean", "description": "Run in a terminal (for REPLs and full-screen programs)."},
                    "yieldTimeMs": {"type": "integer", "minimum": 250, "maximum": 30000},
                    "maxOutputBytes": {"type": "integer", "minimum": 1, "maximum": 1048576}
                }),
                &["computerId", "command"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            a.required("command")?;
            let body = a.pick(&[
                ("command", "command"),
                ("cwd", "cwd"),
                ("tty", "tty"),
                ("yieldTimeMs", "yieldTimeMs"),
                ("maxOutputBytes", "maxOutputBytes"),
            ]);
            Ok(ApiCall { method: "POST", path: format!("/v1/computers/{id}/sessions"), body: Some(body) })
        },
    },
    BotTool {
        name: "openbot_computer_write_stdin",
        description: "Types into a running session of a Computer (C escapes: \\n, \\x03 for Ctrl-C) and answers \
                      its new output. Empty chars just reads.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "session": {"type": "string", "description": "The session id (cse_…) openbot_computer_exec answered."},
                    "chars": {"type": "string"},
                    "yieldTimeMs": {"type": "integer", "minimum": 250, "maximum": 30000}
                }),
                &["computerId", "session"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let session = a.id("session", "cse")?;
            let body = a.pick(&[("chars", "chars"), ("yieldTimeMs", "yieldTimeMs")]);
            Ok(ApiCall {
                method: "POST",
                path: format!("/v1/computers/{id}/sessions/{session}/input"),
                body: Some(body),
            })
        },
    },
    BotTool {
        name: "openbot_computer_sessions_list",
        description: "Lists your shell sessions on a Computer: the running ones first, then those that ended in \
                      the last 10 minutes, each with its session id, command, whether it still runs, its exit code \
                      or signal, and how much output it has made (offset). Use it to find a command you started \
                      whose session id you no longer have, or to see which of your commands are still running.",
        parameters: || object(json!({"computerId": {"type": "string", "description": COMPUTER}}), &["computerId"]),
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            Ok(ApiCall { method: "GET", path: format!("/v1/computers/{id}/sessions"), body: None })
        },
    },
    BotTool {
        name: "openbot_computer_session_read",
        description: "Reads the output of one of your sessions on a Computer, running or ended (up to 10 minutes \
                      after it ended), from fromOffset, with its state and exit code. Use it to see the output of a \
                      command that ran past its wait (openbot_computer_exec answered `running` and a session id), or \
                      to read again output you already saw. It only looks: nothing is typed and the offset \
                      openbot_computer_write_stdin answers from does not move. Pass the `offset` it answers as the \
                      next fromOffset to read only new output; yieldTimeMs waits for some.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "sessionId": {"type": "string", "description": "The session id (cse_…) from openbot_computer_exec or openbot_computer_sessions_list."},
                    "fromOffset": {"type": "integer", "minimum": 0, "description": "Read the output from this byte offset (default 0: from the start)."},
                    "maxOutputBytes": {"type": "integer", "minimum": 1, "maximum": 1048576},
                    "yieldTimeMs": {"type": "integer", "minimum": 0, "maximum": 30000, "description": "Wait up to this long for output past fromOffset (default 0: answer at once)."}
                }),
                &["computerId", "sessionId"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let session = a.id("sessionId", "cse")?;
            let query = a.query(&["fromOffset", "maxOutputBytes", "yieldTimeMs"])?;
            Ok(ApiCall { method: "GET", path: format!("/v1/computers/{id}/sessions/{session}{query}"), body: None })
        },
    },
    BotTool {
        name: "openbot_computer_screenshot",
        description: "Takes a screenshot of a Computer's desktop (one created with a desktop). Answers the image \
                      (base64 `data`, `mimeType`) with its width and height.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "format": {"type": "string", "enum": ["png", "webp", "jpeg"]},
                    "scale": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "description": "Make the image smaller by this factor."},
                    "region": {"type": "object", "description": "Only this part of the screen: {x, y, width, height}."}
                }),
                &["computerId"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let body = a.pick(&[("format", "format"), ("scale", "scale"), ("region", "region")]);
            Ok(ApiCall { method: "POST", path: format!("/v1/computers/{id}/desktop/screenshot"), body: Some(body) })
        },
    },
    BotTool {
        name: "openbot_computer_desktop_actions",
        description: "Uses a Computer's desktop: sends mouse and keyboard actions in order, then answers a \
                      screenshot. Actions: {type: move, x, y}, {type: click, x?, y?, button?, count?}, {type: drag, \
                      from: {x, y}, to: {x, y}}, {type: scroll, x?, y?, dx, dy}, {type: type, text}, {type: key, keys: \
                      \"ctrl+l\"}, {type: wait, ms}. Fails with InputBusy while a person controls the desktop.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "actions": {"type": "array", "items": {"type": "object"}, "maxItems": 64},
                    "screenshot": {"type": "boolean", "description": "Answer a screenshot after the actions (default true)."}
                }),
                &["computerId", "actions"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let body = a.pick(&[("actions", "actions"), ("screenshot", "screenshot")]);
            Ok(ApiCall { method: "POST", path: format!("/v1/computers/{id}/desktop/actions"), body: Some(body) })
        },
    },
    BotTool {
        name: "computer_mcp",
        description: "The MCP tool servers installed on this bot's Computers: `list` the bindings, `discover` a \
                      binding's tools, `call` one (with an operationId: a repeat answers the first result).",
        parameters: || {
            object(
                json!({
                    "action": {"type": "string", "enum": ["list", "discover", "call"]},
                    "bindingId": {"type": "string"},
                    "operationId": {"type": "string"},
                    "tool": {"type": "string"},
                    "arguments": {"type": "object"}
                }),
                &["action"],
            )
        },
        request: |a, bot| {
            let bot =
                bot.ok_or_else(|| BadArguments("computer_mcp is a bot's tool: call it with a bot's token".into()))?;
            let body = a.pick(&[
                ("action", "action"),
                ("bindingId", "bindingId"),
                ("operationId", "operationId"),
                ("tool", "tool"),
                ("arguments", "arguments"),
            ]);
            Ok(ApiCall { method: "POST", path: format!("/api/bots/{bot}/tools/computer_mcp"), body: Some(body) })
        },
    },
];

/// The list in a model vendor's tool format: `openai` (`{"type": "function", "function": {name,
/// description, parameters}}`) or `anthropic` (`{name, description, input_schema}`).
pub fn listed(format: &str) -> Option<Vec<Value>> {
    let each = |t: &BotTool| match format {
        "openai" => Some(
            json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": (t.parameters)()}}),
        ),
        "anthropic" => Some(json!({"name": t.name, "description": t.description, "input_schema": (t.parameters)()})),
        _ => None,
    };
    registry().iter().map(each).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_schema_is_an_object_naming_its_required_keys() {
        let mut names: Vec<&str> = registry().iter().map(|t| t.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), registry().len());
        for t in registry() {
            let p = (t.parameters)();
            assert_eq!(p["type"], "object", "{}", t.name);
            for r in p["required"].as_array().expect("required") {
                assert!(p["properties"].get(r.as_str().unwrap_or_default()).is_some(), "{}: {r}", t.name);
            }
        }
        let openai = listed("openai").expect("openai");
        assert_eq!(openai[0]["function"]["name"], "openbot_computers_list");
        let anthropic = listed("anthropic").expect("anthropic");
        assert!(anthropic.iter().all(|t| t["input_schema"]["type"] == "object"));
        assert!(listed("other").is_none());
    }

    #[test]
    fn calls_become_api_requests_and_bad_ids_never_reach_a_path() {
        let exec = find("openbot_computer_exec").expect("exec");
        let args = json!({"computerId": "cmp_1", "command": "echo hi", "yieldTimeMs": 1000, "extra": 1});
        let call = (exec.request)(&Args(&args), None).expect("a request");
        assert_eq!(call.path, "/v1/computers/cmp_1/sessions");
        assert_eq!(call.body, Some(json!({"command": "echo hi", "yieldTimeMs": 1000})));
        for bad in ["cmp_1/../../v1/tokens", "cmp_", "tok_1", "cmp_a?x=1"] {
            let args = json!({"computerId": bad, "command": "x"});
            assert!((exec.request)(&Args(&args), None).is_err(), "{bad}");
        }
        let create = find("openbot_computers_create").expect("create");
        let args = json!({"commandKey": "k", "provider": "cpp_1", "reason": "work"});
        let call = (create.request)(&Args(&args), None).expect("a request");
        assert_eq!(
            call.body.expect("body")["source"],
            json!({"_tag": "Provider", "provider": "cpp_1", "template": null})
        );
        let list = find("openbot_computer_sessions_list").expect("sessions list");
        let call = (list.request)(&Args(&json!({"computerId": "cmp_1"})), None).expect("a request");
        assert_eq!(call, ApiCall { method: "GET", path: "/v1/computers/cmp_1/sessions".into(), body: None });
        let read = find("openbot_computer_session_read").expect("session read");
        let args = json!({"computerId": "cmp_1", "sessionId": "cse_2", "fromOffset": 5, "yieldTimeMs": 0, "maxOutputBytes": null});
        let call = (read.request)(&Args(&args), None).expect("a request");
        assert_eq!(
            (call.method, call.path.as_str()),
            ("GET", "/v1/computers/cmp_1/sessions/cse_2?fromOffset=5&yieldTimeMs=0")
        );
        assert_eq!(call.body, None);
        let call =
            (read.request)(&Args(&json!({"computerId": "cmp_1", "sessionId": "cse_2"})), None).expect("a request");
        assert_eq!(call.path, "/v1/computers/cmp_1/sessions/cse_2");
        for bad in [
            json!({"computerId": "cmp_1", "sessionId": "cse_2?fromOffset=9"}),
            json!({"computerId": "cmp_1", "sessionId": "../cse_2"}),
            json!({"computerId": "cmp_1"}),
            json!({"computerId": "cmp_1", "sessionId": "cse_2", "fromOffset": "0&yieldTimeMs=30000"}),
            json!({"computerId": "cmp_1", "sessionId": "cse_2", "fromOffset": -1}),
            json!({"computerId": "cmp_1", "sessionId": "cse_2", "yieldTimeMs": 1.5}),
        ] {
            assert!((read.request)(&Args(&bad), None).is_err(), "{bad}");
        }
        let schema = (read.parameters)();
        assert_eq!(schema["required"], json!(["computerId", "sessionId"]));
        for key in ["fromOffset", "maxOutputBytes", "yieldTimeMs"] {
            assert_eq!(schema["properties"][key]["type"], "integer", "{key}");
        }
        let mcp = find("computer_mcp").expect("computer_mcp");
        assert!((mcp.request)(&Args(&json!({"action": "list"})), None).is_err(), "a bot's tool");
        let call = (mcp.request)(&Args(&json!({"action": "list"})), Some("bot_1")).expect("a request");
        assert_eq!(call.path, "/api/bots/bot_1/tools/computer_mcp");
    }
}
