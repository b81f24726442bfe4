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

const PATH: &str = "The file's path (relative: from /workspace).";

const USER: &str = "Act as `user` (the default) or as `root` (if this bot's grant allows root).";

/// `path=` (and `user=`) of a file route, encoded: any path reaches the query as itself.
fn file_query(a: &Args) -> Result<form_urlencoded::Serializer<'static, String>, BadArguments> {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("path", a.required("path")?);
    if let Some(u) = a.str("user") {
        if !matches!(u, "user" | "root") {
            return Err(BadArguments("`user` is user or root".into()));
        }
        q.append_pair("user", u);
    }
    Ok(q)
}

/// A port from 1 to 65535.
fn port(a: &Args) -> Result<u16, BadArguments> {
    a.uint("port")?
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| BadArguments("`port` is required: a number from 1 to 65535".into()))
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

static TOOLS: [BotTool; 38] = [
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
                    "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Environment variables for every session (names [A-Za-z_][A-Za-z0-9_]*, not COMPUTER_AGENT_*; at most 64)."},
                    "resources": {"type": "object", "properties": {"cpus": {"type": "number"}, "memoryMb": {"type": "integer"}}, "additionalProperties": false, "description": "CPUs and memory within the template's ceilings (docker providers only)."},
                    "metadata": {"type": "object", "additionalProperties": {"type": "string"}, "description": "At most 32 string labels, a filter of the Computers' list (metadata.<key>=<value>)."},
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
                ("env", "env"),
                ("resources", "resources"),
                ("metadata", "metadata"),
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
        name: "openbot_computer_session_kill",
        description: "Stops one of your running sessions on a Computer (its process group gets SIGKILL) and answers \
                      its last state: for a command that runs too long or hangs.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "sessionId": {"type": "string", "description": "The session id (cse_…)."}
                }),
                &["computerId", "sessionId"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let session = a.id("sessionId", "cse")?;
            Ok(ApiCall { method: "DELETE", path: format!("/v1/computers/{id}/sessions/{session}"), body: None })
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
        name: "openbot_computer_file_read",
        description: "Reads a file on a Computer: UTF-8 text, or base64 for bytes (encoding). A whole read is at most \
                      16 MiB; a larger file is read by ranges (offset, length: the answer gives totalSize, and a text \
                      range starts and ends on whole characters).",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "path": {"type": "string", "description": PATH},
                    "encoding": {"type": "string", "enum": ["utf8", "base64"]},
                    "offset": {"type": "integer", "minimum": 0, "description": "Read from this byte (a ranged read)."},
                    "length": {"type": "integer", "minimum": 0, "maximum": 16777216, "description": "Read at most this many bytes (a ranged read)."},
                    "user": {"type": "string", "enum": ["user", "root"], "description": USER}
                }),
                &["computerId", "path"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let mut q = file_query(a)?;
            if let Some(e) = a.str("encoding") {
                if !matches!(e, "utf8" | "base64") {
                    return Err(BadArguments("`encoding` is utf8 or base64".into()));
                }
                q.append_pair("encoding", e);
            }
            for key in ["offset", "length"] {
                if let Some(n) = a.uint(key)? {
                    q.append_pair(key, &n.to_string());
                }
            }
            Ok(ApiCall { method: "GET", path: format!("/v1/computers/{id}/files?{}", q.finish()), body: None })
        },
    },
    BotTool {
        name: "openbot_computer_file_write",
        description: "Writes a whole file on a Computer (made with its missing parent directories; an existing file \
                      keeps its mode). The file is replaced at once: readers see the old file or the new one.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "path": {"type": "string", "description": PATH},
                    "content": {"type": "string"},
                    "encoding": {"type": "string", "enum": ["utf8", "base64"], "description": "How content is given (default utf8)."},
                    "user": {"type": "string", "enum": ["user", "root"], "description": USER}
                }),
                &["computerId", "path", "content"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            a.string("content")?;
            let q = file_query(a)?.finish();
            let body = a.pick(&[("content", "content"), ("encoding", "encoding")]);
            Ok(ApiCall { method: "PUT", path: format!("/v1/computers/{id}/files?{q}"), body: Some(body) })
        },
    },
    BotTool {
        name: "openbot_computer_file_edit",
        description: "Edits a text file on a Computer: replaces the exact text `old`, which must occur exactly once \
                      (include enough of the surrounding lines), with `new`. Fails, changing nothing, when `old` is \
                      missing or occurs more than once. The file keeps its mode and owner.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "path": {"type": "string", "description": PATH},
                    "old": {"type": "string", "minLength": 1, "description": "The exact text to replace (whitespace included)."},
                    "new": {"type": "string", "description": "The text that replaces it (may be empty)."},
                    "user": {"type": "string", "enum": ["user", "root"], "description": USER}
                }),
                &["computerId", "path", "old", "new"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            a.required("path")?;
            a.required("old")?;
            a.string("new")?;
            let body = a.pick(&[("path", "path"), ("old", "old"), ("new", "new"), ("user", "user")]);
            Ok(ApiCall { method: "POST", path: format!("/v1/computers/{id}/files/edit"), body: Some(body) })
        },
    },
    BotTool {
        name: "openbot_computer_file_list",
        description: "Lists a directory on a Computer: each entry's name, type (file, dir, symlink, other), size, \
                      mode and modification time.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "path": {"type": "string", "description": "The directory (default: the workspace)."},
                    "user": {"type": "string", "enum": ["user", "root"], "description": USER}
                }),
                &["computerId"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let mut q = form_urlencoded::Serializer::new(String::new());
            q.append_pair("path", a.str("path").filter(|p| !p.is_empty()).unwrap_or("."));
            if let Some(u) = a.str("user") {
                q.append_pair("user", u);
            }
            Ok(ApiCall { method: "GET", path: format!("/v1/computers/{id}/directory?{}", q.finish()), body: None })
        },
    },
    BotTool {
        name: "openbot_computer_file_delete",
        description: "Deletes a file on a Computer (not a directory: use openbot_computer_exec for that).",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "path": {"type": "string", "description": PATH},
                    "user": {"type": "string", "enum": ["user", "root"], "description": USER}
                }),
                &["computerId", "path"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let q = file_query(a)?.finish();
            Ok(ApiCall { method: "DELETE", path: format!("/v1/computers/{id}/files?{q}"), body: None })
        },
    },
    BotTool {
        name: "openbot_computer_copy_to_box",
        description: "Copies a blob (a file a person attached, by its blobId) to a path on a Computer, checked \
                      byte for byte by its SHA-256; answers the artifact (path, size, sha256).",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "blobId": {"type": "string", "description": "The blob's id (blob_…)."},
                    "path": {"type": "string", "description": PATH},
                    "user": {"type": "string", "enum": ["user", "root"], "description": USER}
                }),
                &["computerId", "blobId", "path"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            a.required("blobId")?;
            a.required("path")?;
            let body = a.pick(&[("blobId", "blobId"), ("path", "path"), ("user", "user")]);
            Ok(ApiCall { method: "POST", path: format!("/v1/computers/{id}/copy-to-box"), body: Some(body) })
        },
    },
    BotTool {
        name: "openbot_computer_copy_from_box",
        description: "Copies a file from a Computer into a blob, to hand it to a person: answers the blobId (they \
                      download it from /api/blobs/{blobId}), its size and SHA-256.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "path": {"type": "string", "description": PATH},
                    "mimeType": {"type": "string", "description": "The file's media type (default application/octet-stream)."},
                    "user": {"type": "string", "enum": ["user", "root"], "description": USER}
                }),
                &["computerId", "path"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            a.required("path")?;
            let body = a.pick(&[("path", "path"), ("mimeType", "mimeType"), ("user", "user")]);
            Ok(ApiCall { method: "POST", path: format!("/v1/computers/{id}/copy-from-box"), body: Some(body) })
        },
    },
    BotTool {
        name: "openbot_computer_port_expose",
        description: "Gives a port of a sandbox Computer (a server listening on 127.0.0.1:port or 0.0.0.0:port) a \
                      public HTTPS address, and answers it (`url`, shown this once). When a person must approve \
                      (state awaiting_approval), the address answers only once they have: tell them.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535}
                }),
                &["computerId", "port"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let port = port(a)?;
            Ok(ApiCall { method: "PUT", path: format!("/v1/computers/{id}/ports/{port}"), body: Some(json!({})) })
        },
    },
    BotTool {
        name: "openbot_computer_port_list",
        description: "Lists a Computer's exposed ports: each one's state (open, awaiting_approval) and who exposed \
                      it (never its address).",
        parameters: || object(json!({"computerId": {"type": "string", "description": COMPUTER}}), &["computerId"]),
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            Ok(ApiCall { method: "GET", path: format!("/v1/computers/{id}/ports"), body: None })
        },
    },
    BotTool {
        name: "openbot_computer_port_close",
        description: "Ends a port's public address: every node refuses it from then on.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535}
                }),
                &["computerId", "port"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let port = port(a)?;
            Ok(ApiCall { method: "DELETE", path: format!("/v1/computers/{id}/ports/{port}"), body: None })
        },
    },
    BotTool {
        name: "openbot_computer_desktop_stream",
        description: "Makes a link for a person to watch (mode view) or use (mode control, if this bot's grant \
                      allows it) a Computer's desktop in their browser: show it to them, e.g. \"take over here\". \
                      The link works once and expires soon.",
        parameters: || {
            object(
                json!({
                    "computerId": {"type": "string", "description": COMPUTER},
                    "mode": {"type": "string", "enum": ["view", "control"]}
                }),
                &["computerId", "mode"],
            )
        },
        request: |a, _| {
            let id = a.id("computerId", "cmp")?;
            let mode = a.required("mode")?;
            if !matches!(mode, "view" | "control") {
                return Err(BadArguments("`mode` is view or control".into()));
            }
            Ok(ApiCall {
                method: "POST",
                path: format!("/v1/computers/{id}/desktop/stream"),
                body: Some(json!({"mode": mode})),
            })
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
                      changed: take a new snapshot and use its refs. A download it starts is saved in \
                      /workspace/Downloads and listed in `downloads` (name, path, size, sha256).",
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
        name: "openbot_browser_fill_secret",
        description: "Types a secret of the vault into a field by its ref, without you ever seeing it: a password \
                      or username into a sign-in field, a one-time code (totp) into a code field, or a text \
                      secret into a text field, on a page of one of the secret's origins. Your grant on the \
                      Computer must name the secret (ask your member). The answer, later snapshots and \
                      screenshots show it masked (`[secret \"name\"]`). With submit, presses Enter after. Give \
                      an actionId when it may change something outside (a submit that signs in).",
        parameters: || {
            browser_schema(
                json!({
                    "ref": {"type": "string", "description": REF},
                    "secret": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[a-z0-9][a-z0-9._-]*$", "description": "The secret's name, as your grant lists it."},
                    "submit": {"type": "boolean", "description": "Press Enter after."},
                    "timeoutMs": {"type": "integer", "minimum": 1, "maximum": 60000, "description": WAIT}
                }),
                &["ref", "secret"],
                true,
            )
        },
        request: |a, _| {
            browser_call(a, "fill_secret", &["ref", "secret", "submit", "timeoutMs"], true, |a| {
                a.required("ref")?;
                a.string("secret").map(|_| ())
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
        name: "openbot_browser_dialog",
        description: "Answers the JavaScript dialog (alert, confirm, prompt, beforeunload) open on a browser tab: \
                      accept (OK; for a prompt, with text) or dismiss (Cancel). A tool that opens a dialog answers \
                      at once with it (`dialog`: type, message, defaultPrompt), and the tab takes no other input \
                      until it is answered. Give an actionId when accepting may change something outside (a \
                      confirm before a delete): a retry with the same id never answers twice.",
        parameters: || {
            browser_schema(
                json!({
                    "accept": {"type": "boolean", "description": "OK (true) or Cancel (false)."},
                    "text": {"type": "string", "maxLength": 16384, "description": "A prompt's answer (with accept: true)."},
                    "timeoutMs": {"type": "integer", "minimum": 1, "maximum": 60000, "description": WAIT}
                }),
                &["accept"],
                true,
            )
        },
        request: |a, _| {
            browser_call(a, "dialog", &["accept", "text", "timeoutMs"], true, |a| match a.0.get("accept") {
                Some(Value::Bool(_)) if a.0.get("text").is_none_or(Value::is_string) => Ok(()),
                Some(Value::Bool(_)) => Err(BadArguments("`text` is a string".into())),
                _ => Err(BadArguments("`accept` is required (true or false)".into())),
            })
        },
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
                    "actionId": {"type": "string", "description": "The actionId you gave the click, type, press, select, upload or dialog."}
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

    /// Routes on a Computer that no tool stands for, and why.
    const NOT_TOOLS: &[(&str, &str, &str)] = &[
        ("get", "/v1/computers/{id}", "openbot_computers_list answers every Computer with its state"),
        (
            "delete",
            "/v1/computers/{id}",
            "openbot_computers_release with destroy deletes it, as a capability a person may have to approve",
        ),
        (
            "post",
            "/v1/computers/{id}/pause",
            "a lifecycle command of people and of the idle timer (pauseAfter at create)",
        ),
        ("post", "/v1/computers/{id}/resume", "a paused Computer resumes by itself on a bot's next call"),
        ("post", "/v1/computers/{id}/stop", "a lifecycle command of people"),
        (
            "post",
            "/v1/computers/{id}/recreate",
            "an operator's replacement of the sandbox (a newer image); the bot's tools and their state carry over",
        ),
        ("get", "/v1/computers/{id}/usage", "an operator's view of use and cost"),
        ("get", "/v1/computers/{id}/sandbox", "an operator's view of the provider's sandbox"),
        (
            "put",
            "/v1/computers/{id}/egress",
            "a member sets where a sandbox may connect; a bot's program asks through the API (computers.egress, approved by a member), not a model's tool",
        ),
        (
            "get",
            "/v1/computers/{id}/egress",
            "the owner's policy and the gateway's counts; a refused request already names its host (403 from the gateway)",
        ),
        ("get", "/v1/computers/{id}/bots", "grants are given by members: a bot never grants itself"),
        ("put", "/v1/computers/{id}/bots/{bot}", "grants are given by members: a bot never grants itself"),
        ("get", "/v1/computers/{id}/bots/{bot}", "grants are given by members: a bot never grants itself"),
        ("delete", "/v1/computers/{id}/bots/{bot}", "grants are given by members: a bot never grants itself"),
        (
            "post",
            "/v1/computers/{id}/browser/actions/{action}/decision",
            "a person decides an unknown action, never the bot that acted",
        ),
        ("post", "/v1/computers/{id}/sessions/{sid}/resize", "a person's terminal size (tty sessions in a console)"),
        (
            "get",
            "/v1/computers/{id}/sessions/{sid}/output",
            "an SSE stream for people's terminals: a bot reads with openbot_computer_session_read",
        ),
        ("get", "/v1/computers/{id}/desktop", "the desktop's state: openbot_computer_screenshot shows it"),
        ("post", "/v1/computers/{id}/desktop/release", "ends a person's takeover of the input: a person's act"),
        (
            "get",
            "/v1/computers/{id}/browser/sessions",
            "openbot_browser_open answers its session; a snapshot names its tabs",
        ),
        ("post", "/v1/computers/{id}/browser/evidence", "the evidence of an action, for the people who decide it"),
        (
            "get",
            "/v1/computers/{id}/desktop/view",
            "a person's browser, with a single-use ticket (openbot_computer_desktop_stream makes one)",
        ),
        ("get", "/v1/computers/{id}/desktop/view/{*file}", "noVNC's files, for a person's browser"),
        ("get", "/v1/computers/{id}/desktop/websockify", "a person's desktop stream, behind its ticket's cookie"),
        ("get", "/v1/computers/{id}/ports/{port}", "openbot_computer_port_list answers every port"),
    ];

    /// Arguments that make a request, from a tool's schema.
    fn sample(t: &BotTool) -> Value {
        let p = (t.parameters)();
        let mut args = serde_json::Map::new();
        for (k, s) in p["properties"].as_object().into_iter().flatten() {
            let v = match k.as_str() {
                "computerId" => json!("cmp_1"),
                "session" if t.name.starts_with("openbot_browser") => json!("b-1"),
                "sessionId" | "session" => json!("cse_1"),
                "provider" => json!("cpp_1"),
                "bindingId" => json!("tb_1"),
                "port" => json!(8080),
                "mode" => s["enum"][0].clone(),
                "action" => s["enum"].get(0).cloned().unwrap_or(json!("a-1")),
                "actionId" => json!("a-1"),
                _ => match s["type"].as_str() {
                    Some("integer") => json!(1),
                    Some("boolean") => json!(true),
                    Some("array") => json!(["x"]),
                    Some("object") => json!({}),
                    _ => s["enum"].get(0).cloned().unwrap_or(json!("x")),
                },
            };
            args.insert(k.clone(), v);
        }
        Value::Object(args)
    }

    fn matches(pattern: &str, path: &str) -> bool {
        let (p, q): (Vec<_>, Vec<_>) = (pattern.split('/').collect(), path.split('/').collect());
        p.len() == q.len() && p.iter().zip(&q).all(|(a, b)| a.starts_with('{') || a == b)
    }

    /// Every route a bot may call on a Computer has a tool, or is in [`NOT_TOOLS`] with the
    /// reason; every tool's request is a route the router serves.
    #[test]
    fn every_route_on_a_computer_has_a_tool_or_a_reason() {
        let routes = crate::http::routes();
        let mut covered = std::collections::BTreeSet::new();
        for t in registry() {
            let args = sample(t);
            let call =
                (t.request)(&Args(&args), Some("bot_1")).unwrap_or_else(|e| panic!("{}: {args}: {}", t.name, e.0));
            let path = call.path.split('?').next().unwrap_or_default();
            let route = routes
                .iter()
                .find(|(m, p)| m.eq_ignore_ascii_case(call.method) && matches(p, path))
                .unwrap_or_else(|| panic!("{} makes {} {path}, which no route serves", t.name, call.method));
            covered.insert(*route);
        }
        let excused: std::collections::BTreeSet<(&str, &str)> = NOT_TOOLS.iter().map(|(m, p, _)| (*m, *p)).collect();
        for (m, p) in routes.iter().filter(|(_, p)| p.starts_with("/v1/computers/{id}")) {
            assert!(
                covered.contains(&(*m, *p)) || excused.contains(&(*m, *p)),
                "{m} {p}: no bot tool stands for it; add one, or list it in NOT_TOOLS with the reason"
            );
            assert!(
                !(covered.contains(&(*m, *p)) && excused.contains(&(*m, *p))),
                "{m} {p} has a tool: not in NOT_TOOLS"
            );
        }
        for (m, p, _) in NOT_TOOLS {
            assert!(routes.contains(&(*m, *p)), "NOT_TOOLS names {m} {p}, which the router does not serve");
        }
    }

    #[test]
    fn file_and_port_tools_encode_their_paths_and_refuse_bad_arguments() {
        let call = |name: &str, args: Value| (find(name).expect(name).request)(&Args(&args), None);
        let read = call(
            "openbot_computer_file_read",
            json!({"computerId": "cmp_1", "path": "a b/c&d=e?.txt", "offset": 5, "length": 10}),
        );
        assert_eq!(
            read.expect("read").path,
            "/v1/computers/cmp_1/files?path=a+b%2Fc%26d%3De%3F.txt&offset=5&length=10"
        );
        let write = call(
            "openbot_computer_file_write",
            json!({"computerId": "cmp_1", "path": "x", "content": "", "user": "root"}),
        );
        assert_eq!(write.expect("write").body, Some(json!({"content": ""})));
        assert!(
            call(
                "openbot_computer_file_write",
                json!({"computerId": "cmp_1", "path": "x", "content": "", "user": "admin"})
            )
            .is_err()
        );
        assert!(call("openbot_computer_file_read", json!({"computerId": "cmp_1", "path": "x", "offset": -1})).is_err());
        assert!(
            call("openbot_computer_file_edit", json!({"computerId": "cmp_1", "path": "x", "old": "", "new": "y"}))
                .is_err()
        );
        let list = call("openbot_computer_file_list", json!({"computerId": "cmp_1"})).expect("list");
        assert_eq!(list.path, "/v1/computers/cmp_1/directory?path=.");
        for bad in [json!(0), json!(65536), json!("80/../x"), json!(null)] {
            assert!(
                call("openbot_computer_port_expose", json!({"computerId": "cmp_1", "port": bad})).is_err(),
                "{bad}"
            );
        }
        let close = call("openbot_computer_port_close", json!({"computerId": "cmp_1", "port": 3000})).expect("close");
        assert_eq!((close.method, close.path.as_str()), ("DELETE", "/v1/computers/cmp_1/ports/3000"));
        assert!(call("openbot_computer_desktop_stream", json!({"computerId": "cmp_1", "mode": "admin"})).is_err());
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
                "openbot_browser_dialog",
                s(json!({"accept": true, "text": "yes", "actionId": "d-1"})),
                "POST",
                format!("{b}/dialog"),
                Some(json!({"session": "b-0123456789abcdef", "accept": true, "text": "yes", "actionId": "d-1"})),
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
            ("openbot_browser_dialog", s(json!({}))),
            ("openbot_browser_dialog", s(json!({"accept": "yes"}))),
            ("openbot_browser_dialog", s(json!({"accept": true, "text": 3}))),
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
        assert_eq!(required("openbot_browser_fill_secret"), json!(["computerId", "session", "ref", "secret"]));
        assert_eq!(required("openbot_browser_session_status"), json!(["computerId", "session", "origin", "probes"]));
        assert_eq!(required("openbot_browser_action"), json!(["computerId", "actionId"]));
        for t in registry().iter().filter(|t| t.name.starts_with("openbot_browser_")) {
            let p = (t.parameters)();
            let acting = ["click", "type", "press", "select", "upload", "dialog", "fill_secret"]
                .iter()
                .any(|a| t.name.ends_with(a));
            assert_eq!(p["properties"].get("actionId").is_some(), acting || t.name.ends_with("_action"), "{}", t.name);
            if acting {
                assert!(t.description.contains("actionId"), "{}", t.name);
            }
        }
    }
}
