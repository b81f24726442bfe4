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

    /// A string that must be present (it may be empty).
    fn string(&self, key: &str) -> Result<&str, BadArguments> {
        self.str(key).ok_or_else(|| BadArguments(format!("`{key}` is required (a string)")))
    }

    /// A non-empty list of strings that must be present.
    fn strings(&self, key: &str) -> Result<(), BadArguments> {
        match self.0.get(key).and_then(Value::as_array) {
            Some(v) if !v.is_empty() && v.iter().all(Value::is_string) => Ok(()),
            _ => Err(BadArguments(format!("`{key}` is required: a non-empty list of strings"))),
        }
    }

    /// A name of `[A-Za-z0-9_-]` (and `.`, `:` where `extra` says) for a path segment, never
    /// only dots (nothing else can reach the path).
    fn segment(&self, key: &str, extra: &[u8]) -> Result<&str, BadArguments> {
        let v = self.required(key)?;
        let ok = v.len() <= 128
            && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || extra.contains(&b))
            && !v.bytes().all(|b| b == b'.');
        if ok { Ok(v) } else { Err(BadArguments(format!("`{key}` is not a valid {key}"))) }
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

const SESSION: &str = "The browser session's id (b-…), from openbot_browser_open.";

const TAB: &str = "The tab's id (needed only when the session has more than one tab).";

const REF: &str = "An element's ref (`e12`) from the latest openbot_browser_snapshot of this tab.";

const ACTION_ID: &str = "Your id for this action (1-128 of [A-Za-z0-9-_.:]). Give one whenever the action may \
                         change something outside (send, buy, post, delete): the same id is never sent twice, a \
                         retry answers the first attempt's record (read it with openbot_browser_action).";

/// The schema of a browser tool: computerId, session, tab, then `props`; `acting` adds the action
/// record's fields.
fn browser_schema(props: Value, required: &[&str], acting: bool) -> Value {
    let mut all = json!({
        "computerId": {"type": "string", "description": COMPUTER},
        "session": {"type": "string", "description": SESSION},
        "tab": {"type": "string", "description": TAB}
    });
    let extra = props.as_object().into_iter().flatten();
    let action = json!({
        "actionId": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9._:-]+$", "description": ACTION_ID},
        "runId": {"type": "string", "description": "The run this action belongs to (with an actionId and runClaim)."},
        "runClaim": {"type": "string", "description": "The claim your runtime got for the run (with runId): the action is refused LeaseLost once it no longer holds the run's lease."},
        "intent": {"type": "string", "maxLength": 1024, "description": "What the action is meant to do, in words (with an actionId; kept in the record)."},
        "evidence": {"type": "object", "description": "What you know that justifies it (a file's SHA-256, the account, …), kept with the record (with an actionId)."}
    });
    let action = if acting { action.as_object().cloned().unwrap_or_default() } else { Default::default() };
    if let Some(o) = all.as_object_mut() {
        for (k, v) in extra.chain(action.iter()) {
            o.insert(k.clone(), v.clone());
        }
    }
    let mut keys = vec!["computerId", "session"];
    keys.extend_from_slice(required);
    object(all, &keys)
}

/// The request of a browser tool: `POST /v1/computers/:id/browser/{route}` with session, tab
/// and `keys` (the action record's too when `acting`), after the required ones are checked by
/// `check`.
fn browser_call(
    a: &Args,
    route: &str,
    keys: &[&str],
    acting: bool,
    check: impl Fn(&Args) -> Result<(), BadArguments>,
) -> Result<ApiCall, BadArguments> {
    let id = a.id("computerId", "cmp")?;
    a.required("session")?;
    check(a)?;
    let mut all = vec!["session", "tab"];
    all.extend_from_slice(keys);
    if acting {
        all.extend_from_slice(&["actionId", "runId", "runClaim", "intent", "evidence"]);
    }
    let pairs: Vec<(&str, &str)> = all.iter().map(|k| (*k, *k)).collect();
    Ok(ApiCall { method: "POST", path: format!("/v1/computers/{id}/browser/{route}"), body: Some(a.pick(&pairs)) })
}

const WAIT: &str = "How long to wait for a page load it starts, in ms (default 15000).";

/// Every bot tool, in the order they are listed.
pub fn registry() -> &'static [BotTool] {
    &TOOLS
}

/// The tool named `name`.
pub fn find(name: &str) -> Option<&'static BotTool> {
    TOOLS.iter().find(|t| t.name == name)
}

static TOOLS: [BotTool; 24] = [
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
        name: "openbot_browser_open",
        description: "Opens a browser session on a Computer and answers its id (`session`) and tabs. mode \
                      `automation` (default) is headless; `takeover` runs it on the Computer's desktop, where a \
                      person can watch and take control. A profile keeps cookies and sign-ins between sessions; \
                      one open session per profile, at most 4 sessions.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "mode": {"type": "string", "enum": ["automation", "takeover"]},
                    "profile": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$", "description": "The profile to use (default `default`)."},
                    "url": {"type": "string", "description": "A first page to load (http, https or about:blank)."}
                }),
                &["computerId"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let body = a.pick(&[("mode", "mode"), ("profile", "profile"), ("url", "url")]);
            Ok(ApiCall { method: "POST", path: format!("/v1/computers/{id}/browser/sessions"), body: Some(body) })
        },
    },
    BotTool {
        name: "openbot_browser_close",
        description: "Closes a browser session on a Computer (its profile keeps its cookies).",
        parameters: || browser_schema(json!({}), &[], false),
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let session = a.segment("session", b"")?;
            Ok(ApiCall { method: "DELETE", path: format!("/v1/computers/{id}/browser/sessions/{session}"), body: None })
        },
    },
    BotTool {
        name: "openbot_browser_navigate",
        description: "Loads a URL (http, https or about:blank) in a browser tab and waits for the load. Answers \
                      the final url, title and HTTP status. Take a snapshot to see the page.",
        parameters: || {
            browser_schema(
                json!({
                    "url": {"type": "string"},
                    "timeoutMs": {"type": "integer", "minimum": 1, "maximum": 60000, "description": "How long to wait for the load, in ms (default 15000)."}
                }),
                &["url"],
                false,
            )
        },
        request: |a, _| browser_call(a, "navigate", &["url", "timeoutMs"], false, |a| a.required("url").map(|_| ())),
    },
    BotTool {
        name: "openbot_browser_snapshot",
        description: "Answers a browser tab's accessibility tree as text: each element's role, name, value, \
                      states and ref (`e12`). The other browser tools name elements by these refs, which hold \
                      only for this snapshot and page: after a navigation or a StaleRef error, take a new one.",
        parameters: || {
            browser_schema(
                json!({
                    "maxElements": {"type": "integer", "minimum": 1, "maximum": 20000, "description": "At most this many elements."},
                    "root": {"type": "string", "description": "Only the subtree of this ref."},
                    "format": {"type": "string", "enum": ["text", "json"], "description": "`json` adds each element as an object (default `text`)."}
                }),
                &[],
                false,
            )
        },
        request: |a, _| browser_call(a, "snapshot", &["maxElements", "root", "format"], false, |_| Ok(())),
    },
    BotTool {
        name: "openbot_browser_click",
        description: "Clicks an element by its ref and answers the outcome (done or unknown, and whether a page \
                      loaded). Give an actionId when the click may change something outside (submit, buy, send, \
                      delete): a retry with the same id never clicks twice. A StaleRef error means the page \
                      changed: take a new snapshot and use its refs.",
        parameters: || {
            browser_schema(
                json!({
                    "ref": {"type": "string", "description": REF},
                    "timeoutMs": {"type": "integer", "minimum": 1, "maximum": 60000, "description": WAIT}
                }),
                &["ref"],
                true,
            )
        },
        request: |a, _| browser_call(a, "click", &["ref", "timeoutMs"], true, |a| a.required("ref").map(|_| ())),
    },
    BotTool {
        name: "openbot_browser_type",
        description: "Replaces the text of an input by its ref (empty text clears it); with submit, presses \
                      Enter after. Give an actionId when it may change something outside (a submit that sends): \
                      a retry with the same id never types twice. A StaleRef error means take a new snapshot.",
        parameters: || {
            browser_schema(
                json!({
                    "ref": {"type": "string", "description": REF},
                    "text": {"type": "string", "maxLength": 16384},
                    "submit": {"type": "boolean", "description": "Press Enter after typing."},
                    "timeoutMs": {"type": "integer", "minimum": 1, "maximum": 60000, "description": WAIT}
                }),
                &["ref", "text"],
                true,
            )
        },
        request: |a, _| {
            browser_call(a, "type", &["ref", "text", "submit", "timeoutMs"], true, |a| {
                a.required("ref")?;
                a.string("text").map(|_| ())
            })
        },
    },
    BotTool {
        name: "openbot_browser_press",
        description: "Presses a key or a combination (`Enter`, `Escape`, `ctrl+l`, `shift+Tab`) on the focused \
                      element of a browser tab. Give an actionId when it may change something outside: a retry \
                      with the same id never presses twice.",
        parameters: || {
            browser_schema(
                json!({
                    "keys": {"type": "string", "description": "The key or combination."},
                    "timeoutMs": {"type": "integer", "minimum": 1, "maximum": 60000, "description": WAIT}
                }),
                &["keys"],
                true,
            )
        },
        request: |a, _| browser_call(a, "press", &["keys", "timeoutMs"], true, |a| a.required("keys").map(|_| ())),
    },
    BotTool {
        name: "openbot_browser_select",
        description: "Chooses options of a <select> element by its ref, each named by its value or its label. \
                      Give an actionId when it may change something outside: a retry with the same id never \
                      selects twice. A StaleRef error means take a new snapshot.",
        parameters: || {
            browser_schema(
                json!({
                    "ref": {"type": "string", "description": REF},
                    "values": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 64, "description": "The options' values or labels."}
                }),
                &["ref", "values"],
                true,
            )
        },
        request: |a, _| {
            browser_call(a, "select", &["ref", "values"], true, |a| {
                a.required("ref")?;
                a.strings("values")
            })
        },
    },
    BotTool {
        name: "openbot_browser_hover",
        description: "Moves the pointer over an element by its ref (to open a menu or show a tooltip). A \
                      StaleRef error means take a new snapshot.",
        parameters: || {
            browser_schema(
                json!({
                    "ref": {"type": "string", "description": REF},
                    "timeoutMs": {"type": "integer", "minimum": 1, "maximum": 60000, "description": WAIT}
                }),
                &["ref"],
                false,
            )
        },
        request: |a, _| browser_call(a, "hover", &["ref", "timeoutMs"], false, |a| a.required("ref").map(|_| ())),
    },
    BotTool {
        name: "openbot_browser_upload",
        description: "Sets the files of a file input by its ref from files on the Computer (absolute paths under \
                      /workspace, regular, non-empty, at most 16 MiB each, at most 16). Answers each file's size \
                      and sha256 and what the page read back. Give an actionId when the upload may change \
                      something outside: a retry with the same id never uploads twice.",
        parameters: || {
            browser_schema(
                json!({
                    "ref": {"type": "string", "description": "The file input's ref (or the ref listed for a hidden one)."},
                    "paths": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 16, "description": "Absolute paths under /workspace."}
                }),
                &["ref", "paths"],
                true,
            )
        },
        request: |a, _| {
            browser_call(a, "upload", &["ref", "paths"], true, |a| {
                a.required("ref")?;
                a.strings("paths")
            })
        },
    },
    BotTool {
        name: "openbot_browser_screenshot",
        description: "Takes a screenshot of a browser tab: the viewport, the whole page (fullPage) or one element \
                      (ref). Answers the image (base64 `data`, `mimeType`) with its width and height.",
        parameters: || {
            browser_schema(
                json!({
                    "fullPage": {"type": "boolean", "description": "The whole page, not only the viewport (not with ref)."},
                    "ref": {"type": "string", "description": "Only this element (from the latest snapshot)."},
                    "format": {"type": "string", "enum": ["png", "jpeg"]},
                    "quality": {"type": "integer", "minimum": 1, "maximum": 100, "description": "JPEG quality (jpeg only)."}
                }),
                &[],
                false,
            )
        },
        request: |a, _| browser_call(a, "screenshot", &["fullPage", "ref", "format", "quality"], false, |_| Ok(())),
    },
    BotTool {
        name: "openbot_browser_session_status",
        description: "Checks whether a browser session's profile is signed in to a site (origin), as probes show \
                      it: a selector or a text present only when signed in, the account expected, a project URL \
                      that must load without a redirect to a login. Answers signedIn, accountMatches, \
                      projectAccessible and the number of cookies (never their values).",
        parameters: || {
            browser_schema(
                json!({
                    "origin": {"type": "string", "description": "The site: `https://host[:port]`, nothing more."},
                    "probes": {
                        "type": "object",
                        "description": "signedInSelector or signedInText is required; page and projectUrl are on origin.",
                        "properties": {
                            "page": {"type": "string", "description": "A page that shows who is signed in (default: the origin's /)."},
                            "signedInSelector": {"type": "string", "description": "A CSS selector present only when signed in; its text shows the account."},
                            "signedInText": {"type": "string", "description": "A text present only when signed in."},
                            "account": {"type": "string", "description": "The account expected."},
                            "projectUrl": {"type": "string", "description": "A URL that must load with a 2xx, not redirected to a login."}
                        },
                        "additionalProperties": false
                    },
                    "timeoutMs": {"type": "integer", "minimum": 1, "maximum": 60000, "description": "How long each page may take, in ms."}
                }),
                &["origin", "probes"],
                false,
            )
        },
        request: |a, _| {
            browser_call(a, "session_status", &["origin", "probes", "timeoutMs"], false, |a| {
                a.required("origin")?;
                match a.0.get("probes") {
                    Some(Value::Object(_)) => Ok(()),
                    _ => Err(BadArguments("`probes` is required (an object)".into())),
                }
            })
        },
    },
    BotTool {
        name: "openbot_browser_action",
        description: "Reads the record of a browser action you sent with an actionId: its tool, state (prepared, \
                      dispatching, done, failed or unknown), request, result and error. Use it after a timeout or \
                      an error to learn whether the action happened before trying anything again; `unknown` \
                      means it may have: check the page instead of repeating it.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "actionId": {"type": "string", "description": "The actionId you gave the click, type, press, select or upload."}
                }),
                &["computerId", "actionId"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let action = a.segment("actionId", b".:")?;
            Ok(ApiCall { method: "GET", path: format!("/v1/computers/{id}/browser/actions/{action}"), body: None })
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

    #[test]
    fn browser_tools_map_to_the_browser_routes_and_refuse_bad_arguments() {
        let b = "/v1/computers/cmp_1/browser";
        let call = |name: &str, args: Value| {
            let t = find(name).unwrap_or_else(|| panic!("{name}"));
            (t.request)(&Args(&args), Some("bot_1"))
        };
        let s = |extra: Value| {
            let mut v = json!({"computerId": "cmp_1", "session": "b-0123456789abcdef"});
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            v
        };
        let ok = [
            (
                "openbot_browser_open",
                json!({"computerId": "cmp_1", "mode": "takeover", "profile": "work", "x": 1}),
                "POST",
                format!("{b}/sessions"),
                Some(json!({"mode": "takeover", "profile": "work"})),
            ),
            ("openbot_browser_close", s(json!({})), "DELETE", format!("{b}/sessions/b-0123456789abcdef"), None),
            (
                "openbot_browser_navigate",
                s(json!({"url": "https://example.com/", "timeoutMs": 500, "tab": "t1"})),
                "POST",
                format!("{b}/navigate"),
                Some(
                    json!({"session": "b-0123456789abcdef", "tab": "t1", "url": "https://example.com/", "timeoutMs": 500}),
                ),
            ),
            (
                "openbot_browser_snapshot",
                s(json!({"maxElements": 10, "actionId": "a"})),
                "POST",
                format!("{b}/snapshot"),
                Some(json!({"session": "b-0123456789abcdef", "maxElements": 10})),
            ),
            (
                "openbot_browser_click",
                s(json!({"ref": "e3", "actionId": "buy-1", "intent": "buy", "extra": 1})),
                "POST",
                format!("{b}/click"),
                Some(json!({"session": "b-0123456789abcdef", "ref": "e3", "actionId": "buy-1", "intent": "buy"})),
            ),
            (
                "openbot_browser_type",
                s(json!({"ref": "e4", "text": "", "submit": true})),
                "POST",
                format!("{b}/type"),
                Some(json!({"session": "b-0123456789abcdef", "ref": "e4", "text": "", "submit": true})),
            ),
            (
                "openbot_browser_press",
                s(json!({"keys": "Enter", "actionId": "p:1"})),
                "POST",
                format!("{b}/press"),
                Some(json!({"session": "b-0123456789abcdef", "keys": "Enter", "actionId": "p:1"})),
            ),
            (
                "openbot_browser_select",
                s(json!({"ref": "e5", "values": ["a"]})),
                "POST",
                format!("{b}/select"),
                Some(json!({"session": "b-0123456789abcdef", "ref": "e5", "values": ["a"]})),
            ),
            (
                "openbot_browser_hover",
                s(json!({"ref": "e6"})),
                "POST",
                format!("{b}/hover"),
                Some(json!({"session": "b-0123456789abcdef", "ref": "e6"})),
            ),
            (
                "openbot_browser_upload",
                s(json!({"ref": "e7", "paths": ["/workspace/a.pdf"], "actionId": "u"})),
                "POST",
                format!("{b}/upload"),
                Some(
                    json!({"session": "b-0123456789abcdef", "ref": "e7", "paths": ["/workspace/a.pdf"], "actionId": "u"}),
                ),
            ),
            (
                "openbot_browser_screenshot",
                s(json!({"fullPage": true})),
                "POST",
                format!("{b}/screenshot"),
                Some(json!({"session": "b-0123456789abcdef", "fullPage": true})),
            ),
            (
                "openbot_browser_session_status",
                s(json!({"origin": "https://example.com", "probes": {"signedInText": "Log out"}})),
                "POST",
                format!("{b}/session_status"),
                Some(
                    json!({"session": "b-0123456789abcdef", "origin": "https://example.com", "probes": {"signedInText": "Log out"}}),
                ),
            ),
            (
                "openbot_browser_action",
                json!({"computerId": "cmp_1", "actionId": "buy-1.a:2"}),
                "GET",
                format!("{b}/actions/buy-1.a:2"),
                None,
            ),
        ];
        for (name, args, method, path, body) in ok {
            let got = call(name, args).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(got, ApiCall { method, path, body }, "{name}");
        }
        let bad = [
            ("openbot_browser_open", json!({"computerId": "cmp_1/../x"})),
            ("openbot_browser_close", json!({"computerId": "cmp_1"})),
            ("openbot_browser_close", json!({"computerId": "cmp_1", "session": "b-1/../../x"})),
            ("openbot_browser_navigate", s(json!({}))),
            ("openbot_browser_navigate", json!({"computerId": "cmp_1", "url": "https://x/"})),
            ("openbot_browser_snapshot", json!({"session": "b-1"})),
            ("openbot_browser_click", s(json!({}))),
            ("openbot_browser_click", s(json!({"ref": 3}))),
            ("openbot_browser_type", s(json!({"ref": "e1"}))),
            ("openbot_browser_type", s(json!({"ref": "e1", "text": 5}))),
            ("openbot_browser_press", s(json!({"keys": ""}))),
            ("openbot_browser_select", s(json!({"ref": "e1", "values": []}))),
            ("openbot_browser_select", s(json!({"ref": "e1", "values": "a"}))),
            ("openbot_browser_hover", s(json!({}))),
            ("openbot_browser_upload", s(json!({"ref": "e1", "paths": [1]}))),
            ("openbot_browser_upload", s(json!({"paths": ["/workspace/a"]}))),
            ("openbot_browser_session_status", s(json!({"origin": "https://example.com"}))),
            ("openbot_browser_session_status", s(json!({"origin": "https://example.com", "probes": "x"}))),
            ("openbot_browser_action", json!({"computerId": "cmp_1"})),
            ("openbot_browser_action", json!({"computerId": "cmp_1", "actionId": ".."})),
            ("openbot_browser_action", json!({"computerId": "cmp_1", "actionId": "a/../b"})),
            ("openbot_browser_action", json!({"computerId": "cmp_1", "actionId": "a?bot=bot_2"})),
        ];
        for (name, args) in bad {
            assert!(call(name, args.clone()).is_err(), "{name}: {args}");
        }
        // Each schema requires what its route requires; the acting tools carry actionId.
        let required = |name: &str| (find(name).map(|t| (t.parameters)())).unwrap_or_default()["required"].clone();
        assert_eq!(required("openbot_browser_open"), json!(["computerId"]));
        assert_eq!(required("openbot_browser_type"), json!(["computerId", "session", "ref", "text"]));
        assert_eq!(required("openbot_browser_session_status"), json!(["computerId", "session", "origin", "probes"]));
        assert_eq!(required("openbot_browser_action"), json!(["computerId", "actionId"]));
        for t in registry().iter().filter(|t| t.name.starts_with("openbot_browser_")) {
            let p = (t.parameters)();
            let acting = ["click", "type", "press", "select", "upload"].iter().any(|a| t.name.ends_with(a));
            assert_eq!(p["properties"].get("actionId").is_some(), acting || t.name.ends_with("_action"), "{}", t.name);
            if acting {
                assert!(t.description.contains("actionId"), "{}", t.name);
            }
        }
    }
}
