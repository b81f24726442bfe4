//! Elements inside iframes (a child module of `page`, the tab tools).
//!
//! **Frames.** A snapshot walks the tab's frames: those in the page's process (its
//! `Page.getFrameTree`, served on the tab's CDP session) and the out-of-process ones (OOPIFs:
//! Chromium runs each site in its own process, so a cross-site iframe is a target of type
//! `iframe` of its own, found in `Target.getTargets` by its `parentId` chain up to the tab and
//! attached with a flat session kept on the tab). Each frame's accessibility tree is read on the
//! session serving its document (`Accessibility.getFullAXTree {frameId}`), and its listing is
//! put under the line of its owner `<iframe>` (`DOM.getFrameOwner` in the parent's document),
//! one level deeper.
//!
//! **Refs.** A ref in a frame also keeps the frame: its id, the session serving it, and the
//! chain of owner `<iframe>`s up to the page (each with the session of the document holding it);
//! its `loader` is the frame's document. It is checked on the frame's session, as a page's ref
//! is on the tab's: a frame that navigated or went away makes it stale.
//!
//! **Points.** Quads of an in-process frame's elements are already in the page's viewport; those
//! of an OOPIF are in the OOPIF's own, so the page point adds the content box corner of the
//! OOPIF's owner `<iframe>` (content: inside its border and padding), up the chain. The hit test
//! runs in the element's own document at the point minus its frame's corner, and then on each
//! owner `<iframe>` in its parent's document (so nothing covers the frame itself). The mouse
//! events go to the tab's session at the page point: Chromium routes them into the frame by hit
//! testing, as it does a person's pointer; text goes to the focused frame.
//!
//! Not handled: frames beyond `MAX_FRAMES`, hidden file inputs inside frames (the snapshot
//! lists those of the page only), navigations of a frame (an action's outcome follows the page's
//! main frame), an upload into an out-of-process frame (refused), and an `<iframe>` scaled or
//! rotated by CSS (its corner is taken as the frame's origin, unscaled).

use std::collections::HashMap;
use std::collections::HashSet;

use serde_json::Value;
use serde_json::json;

use super::BrowserError;
use super::COMMAND;
use super::Listed;
use super::RefInfo;
use super::Tab;
use super::call;
use super::listing;
use crate::browser::cdp::Cdp;

/// A snapshot lists the elements of at most this many frames of a tab (the page included).
pub const MAX_FRAMES: usize = 32;

/// Where a ref's element is when it is inside a frame.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameAt {
    /// The frame's id.
    pub id: String,
    /// The CDP session serving its document: the tab's for an in-process frame, the OOPIF's own.
    pub session: String,
    /// Its owner `<iframe>`, then the owner of the frame holding that one, … up to the page's.
    pub owners: Vec<Owner>,
}

/// An `<iframe>` holding a frame, in its parent's document.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    /// The session serving the parent's document.
    pub session: String,
    /// The `<iframe>` element there.
    pub backend: i64,
    /// The frame it holds is out of the parent's process (served on another session).
    pub oop: bool,
}

/// One frame of a tab.
pub struct Frame {
    /// `None` for the page's main frame.
    pub at: Option<FrameAt>,
    /// The frame's id.
    pub id: String,
    /// The session serving its document.
    pub session: String,
    /// Its document's loader id.
    pub loader: String,
    /// Its parent (an index in the list); `None` for the main frame.
    pub parent: Option<usize>,
    /// Its owner `<iframe>` in the parent's document (`None`: not found; its elements are not
    /// listed).
    pub owner: Option<i64>,
}

/// The session a ref's element is served on.
pub fn session_of<'a>(tab: &'a Tab, info: &'a RefInfo) -> &'a str {
    info.frame.as_ref().map_or(tab.cdp_session.as_str(), |f| f.session.as_str())
}

/// Pushes the frames of a `Page.getFrameTree` tree (depth-first, parents first).
fn push_tree(tree: &Value, session: &str, parent: Option<usize>, out: &mut Vec<Frame>) {
    if out.len() >= MAX_FRAMES {
        return;
    }
    let Some(id) = tree["frame"]["id"].as_str() else { return };
    out.push(Frame {
        at: None,
        id: id.to_string(),
        session: session.to_string(),
        loader: tree["frame"]["loaderId"].as_str().unwrap_or_default().to_string(),
        parent,
        owner: None,
    });
    let me = out.len() - 1;
    for c in tree["childFrames"].as_array().into_iter().flatten() {
        push_tree(c, session, Some(me), out);
    }
}

/// The tab's frames, the main one first, each parent before its children, at most
/// [`MAX_FRAMES`]. Attaches to the tab's OOPIFs not attached yet (and forgets those gone).
pub async fn frames(cdp: &Cdp, tab: &mut Tab, target: &str) -> Result<Vec<Frame>, BrowserError> {
    let s = tab.cdp_session.clone();
    let tree = call(cdp, &s, "Page.getFrameTree", json!({})).await?;
    let mut out = Vec::new();
    push_tree(&tree["frameTree"], &s, None, &mut out);
    let targets = cdp.call(None, "Target.getTargets", json!({}), COMMAND).await?;
    let iframes: Vec<&Value> =
        targets["targetInfos"].as_array().into_iter().flatten().filter(|i| i["type"] == "iframe").collect();
    // The OOPIFs of this tab: those whose parent target is the tab or one of them (parents first).
    let mut ours: Vec<&Value> = Vec::new();
    let mut known: HashSet<&str> = HashSet::from([target]);
    loop {
        let before = ours.len();
        for i in &iframes {
            let (Some(id), Some(parent)) = (i["targetId"].as_str(), i["parentId"].as_str()) else { continue };
            if known.contains(parent) && !known.contains(id) {
                known.insert(id);
                ours.push(i);
            }
        }
        if ours.len() == before {
            break;
        }
    }
    let alive: HashSet<&str> = iframes.iter().filter_map(|i| i["targetId"].as_str()).collect();
    tab.oopifs.retain(|t, _| alive.contains(t.as_str()));
    for i in ours {
        if out.len() >= MAX_FRAMES {
            break;
        }
        let (Some(id), Some(parent_frame)) = (i["targetId"].as_str(), i["parentFrameId"].as_str()) else { continue };
        let Some(parent) = out.iter().position(|f| f.id == parent_frame) else { continue };
        // The session kept, else (or when it no longer answers) a new one; a frame gone
        // meanwhile is left out.
        let mut found = None;
        for kept in [true, false] {
            let session = match tab.oopifs.get(id).filter(|_| kept) {
                Some(s) => s.clone(),
                None => {
                    let params = json!({"targetId": id, "flatten": true});
                    let a = cdp.call(None, "Target.attachToTarget", params, COMMAND).await;
                    let Some(s) = a.ok().and_then(|a| a["sessionId"].as_str().map(String::from)) else { break };
                    tab.oopifs.insert(id.to_string(), s.clone());
                    s
                }
            };
            match call(cdp, &session, "Page.getFrameTree", json!({})).await {
                Ok(tree) => {
                    found = Some((session, tree));
                    break;
                }
                Err(_) => {
                    tab.oopifs.remove(id);
                }
            }
        }
        if let Some((session, tree)) = found {
            push_tree(&tree["frameTree"], &session, Some(parent), &mut out);
        }
    }
    for n in 1..out.len() {
        let Some(p) = out[n].parent else { continue };
        let owner = call(cdp, &out[p].session, "DOM.getFrameOwner", json!({"frameId": out[n].id})).await.ok();
        out[n].owner = owner.and_then(|o| o["backendNodeId"].as_i64());
    }
    for n in 1..out.len() {
        let mut owners = Vec::new();
        let mut at = n;
        while let (Some(p), Some(backend)) = (out[at].parent, out[at].owner) {
            owners.push(Owner { session: out[p].session.clone(), backend, oop: out[p].session != out[at].session });
            at = p;
        }
        if at == 0 {
            out[n].at = Some(FrameAt { id: out[n].id.clone(), session: out[n].session.clone(), owners });
        }
    }
    Ok(out)
}

/// The listing of the frames from `start` down (`root`: a node of that frame to list from),
/// each frame's elements under its owner's line; at most `max`, and whether it stopped early.
/// Each element comes with its frame (an index in `frames`). The nodes' names and values are
/// masked (`masks`: the session's filled secrets) before they are listed (and cut).
pub async fn list(
    cdp: &Cdp,
    frames: &[Frame],
    start: usize,
    root: Option<i64>,
    max: usize,
    masks: &crate::browser::secrets::Masks,
) -> Result<(Vec<(Listed, usize)>, bool), BrowserError> {
    let mut listings: HashMap<usize, Vec<Listed>> = HashMap::new();
    let mut truncated = false;
    for (n, f) in frames.iter().enumerate() {
        let under_start = {
            let mut at = Some(n);
            while let Some(a) = at.filter(|a| *a != start) {
                at = frames[a].parent;
            }
            at.is_some()
        };
        // A frame whose owner is not known cannot be placed (nor clicked into).
        if !under_start || (n != 0 && f.at.is_none()) {
            continue;
        }
        let params = if n == 0 { json!({}) } else { json!({"frameId": f.id}) };
        let Ok(mut tree) = call(cdp, &f.session, "Accessibility.getFullAXTree", params).await else { continue };
        if !masks.is_empty() {
            for n in tree.get_mut("nodes").and_then(Value::as_array_mut).into_iter().flatten() {
                for k in ["name", "value"] {
                    if let Some(v) = n.get_mut(k).and_then(|x| x.get_mut("value")) {
                        masks.json(v);
                    }
                }
            }
        }
        let (l, t) =
            listing(tree["nodes"].as_array().map_or(&[], Vec::as_slice), if n == start { root } else { None }, max);
        // A large page's tree is megabytes of JSON values: freed off this call's path.
        tokio::task::spawn_blocking(move || drop(tree));
        truncated |= t;
        listings.insert(n, l);
    }
    let mut out = Vec::new();
    splice(frames, &listings, start, 0, &mut out);
    if out.len() > max {
        out.truncate(max);
        truncated = true;
    }
    Ok((out, truncated))
}

fn splice(
    frames: &[Frame],
    listings: &HashMap<usize, Vec<Listed>>,
    f: usize,
    base: usize,
    out: &mut Vec<(Listed, usize)>,
) {
    for l in listings.get(&f).into_iter().flatten() {
        let mut shown = l.clone();
        shown.depth += base;
        out.push((shown, f));
        let Some(b) = l.backend else { continue };
        for (c, child) in frames.iter().enumerate() {
            if child.parent == Some(f) && child.owner == Some(b) {
                splice(frames, listings, c, base + l.depth + 1, out);
            }
        }
    }
}

/// Where a frame is on the page: the page point of each owner's content box corner (the frame's
/// viewport origin; the frame's own first, then its parent's, …), and what to add to the quads
/// of the frame's session (its process's viewport) to get page points.
pub struct Geometry {
    pub corners: Vec<(f64, f64)>,
    pub offset: (f64, f64),
}

pub async fn geometry(cdp: &Cdp, f: &FrameAt) -> Result<Geometry, BrowserError> {
    let mut corners = vec![(0.0, 0.0); f.owners.len()];
    let mut offset = (0.0, 0.0);
    for (i, o) in f.owners.iter().enumerate().rev() {
        let b = cdp
            .call(Some(&o.session), "DOM.getBoxModel", json!({"backendNodeId": o.backend}), COMMAND)
            .await
            .map_err(|_| BrowserError::invalid("the element's frame is not visible (its iframe has no box)"))?;
        let c: Vec<f64> = b["model"]["content"].as_array().into_iter().flatten().filter_map(Value::as_f64).collect();
        if c.len() != 8 {
            return Err(BrowserError::invalid("the element's frame is not visible (its iframe has no box)"));
        }
        let (x, y) = (
            c.iter().step_by(2).cloned().fold(f64::MAX, f64::min),
            c.iter().skip(1).step_by(2).cloned().fold(f64::MAX, f64::min),
        );
        corners[i] = (x + offset.0, y + offset.1);
        if o.oop {
            offset = corners[i];
        }
    }
    Ok(Geometry { corners, offset })
}

/// Hit-tests the page point `(x, y)` on each owner `<iframe>` of the frame, in its parent's
/// document: answers `HIT`'s `{ok: true}` when each is what a pointer there meets, else
/// the first answer that is not.
pub async fn hit_owners(cdp: &Cdp, f: &FrameAt, g: &Geometry, x: f64, y: f64) -> Result<Value, BrowserError> {
    for (i, o) in f.owners.iter().enumerate() {
        let (ox, oy) = g.corners.get(i + 1).copied().unwrap_or((0.0, 0.0));
        let resolved = call(cdp, &o.session, "DOM.resolveNode", json!({"backendNodeId": o.backend})).await?;
        let obj = resolved["object"]["objectId"]
            .as_str()
            .ok_or_else(|| BrowserError::invalid("the element's frame is gone from the page"))?;
        let h =
            super::function(cdp, &o.session, obj, super::HIT, json!([{"value": x - ox}, {"value": y - oy}])).await?;
        if h["ok"] != true {
            return Ok(h);
        }
    }
    Ok(json!({"ok": true}))
}

/// The loader id of the frame's document now; `None` when the frame is gone (or its process).
pub async fn loader_of(cdp: &Cdp, f: &FrameAt) -> Option<String> {
    let tree = call(cdp, &f.session, "Page.getFrameTree", json!({})).await.ok()?;
    let mut stack = vec![&tree["frameTree"]];
    while let Some(t) = stack.pop() {
        if t["frame"]["id"] == f.id.as_str() {
            return t["frame"]["loaderId"].as_str().map(String::from);
        }
        stack.extend(t["childFrames"].as_array().into_iter().flatten());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(depth: usize, role: &str, name: &str, backend: Option<i64>) -> Listed {
        Listed { depth, role: role.into(), name: name.into(), value: String::new(), states: Vec::new(), backend }
    }

    fn frame(id: &str, session: &str, parent: Option<usize>, owner: Option<i64>) -> Frame {
        Frame { at: None, id: id.into(), session: session.into(), loader: String::new(), parent, owner }
    }

    #[test]
    fn a_frame_is_listed_under_its_iframe() {
        let tree = json!({"frame": {"id": "main", "loaderId": "l0"}, "childFrames": [
            {"frame": {"id": "a", "loaderId": "l1"}, "childFrames": [{"frame": {"id": "a1", "loaderId": "l2"}}]},
        ]});
        let mut frames = Vec::new();
        push_tree(&tree, "tab", None, &mut frames);
        let got: Vec<(&str, Option<usize>)> = frames.iter().map(|f| (f.id.as_str(), f.parent)).collect();
        assert_eq!(got, vec![("main", None), ("a", Some(0)), ("a1", Some(1))]);

        // The page holds `a` (in its process) in iframe 7 and `b` (another process) in iframe 9;
        // `a` holds `a1` in its iframe 3.
        let frames = vec![
            frame("main", "tab", None, None),
            frame("a", "tab", Some(0), Some(7)),
            frame("b", "oopif", Some(0), Some(9)),
            frame("a1", "tab", Some(1), Some(3)),
        ];
        let mut listings = HashMap::new();
        listings.insert(
            0,
            vec![el(0, "Iframe", "A", Some(7)), el(0, "region", "R", Some(8)), el(1, "Iframe", "B", Some(9))],
        );
        listings.insert(1, vec![el(0, "button", "in a", Some(2)), el(0, "Iframe", "A1", Some(3))]);
        listings.insert(2, vec![el(0, "button", "in b", Some(9))]);
        listings.insert(3, vec![el(0, "textbox", "in a1", Some(4))]);
        let mut out = Vec::new();
        splice(&frames, &listings, 0, 0, &mut out);
        let got: Vec<(usize, &str, usize)> = out.iter().map(|(l, f)| (l.depth, l.name.as_str(), *f)).collect();
        assert_eq!(
            got,
            vec![(0, "A", 0), (1, "in a", 1), (1, "A1", 1), (2, "in a1", 3), (0, "R", 0), (1, "B", 0), (2, "in b", 2)]
        );
    }
}
