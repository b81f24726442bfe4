//! One X11 connection of the agent to its display (x11rb): screenshots through MIT-SHM (a shared
//! memory segment the server fills, with plain `GetImage` when the extension cannot be used),
//! and input through XTest, in order. Characters the keymap lacks are given a spare keycode
//! (remapped, never guessed), which stays mapped until the spare keycodes run out.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use computerd_proto::desktop::Action;
use computerd_proto::desktop::Region;
use x11rb::connection::Connection;
use x11rb::connection::RequestConnection;
use x11rb::protocol::shm;
use x11rb::protocol::xproto;
use x11rb::protocol::xproto::ConnectionExt as _;
use x11rb::protocol::xtest;
use x11rb::rust_connection::DefaultStream;
use x11rb::rust_connection::RustConnection;

use super::keys;

/// How long the focus must stay put after a click before the next action.
const FOCUS_QUIET: Duration = Duration::from_millis(40);
/// The longest wait for it.
const FOCUS_WAIT: Duration = Duration::from_millis(300);

/// Typed text is mapped and sent this many characters at a time.
const TYPE_PIECE: usize = 16;
/// The pause after the keyboard mapping changed, before keys that need it are pressed.
const REMAP_SETTLE: Duration = Duration::from_millis(30);

/// An X authorization: the protocol's name and its data (a 16-byte MIT-MAGIC-COOKIE-1).
#[derive(Clone)]
pub struct Cookie {
    /// e.g. `MIT-MAGIC-COOKIE-1`.
    pub name: Vec<u8>,
    /// The secret.
    pub data: Vec<u8>,
}

impl std::fmt::Debug for Cookie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cookie({}, <redacted>)", String::from_utf8_lossy(&self.name))
    }
}

/// A captured picture: RGB, 3 bytes a pixel, rows top to bottom.
pub struct Picture {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The pixels.
    pub rgb: Vec<u8>,
}

/// A shared memory segment attached by the agent and the X server.
struct Segment {
    seg: shm::Seg,
    addr: *mut u8,
    size: usize,
}

// SAFETY: the mapping is only read while the `Screen` (and its lock) is held.
unsafe impl Send for Segment {}

/// Where the red, green and blue bits of a 32-bit pixel are.
#[derive(Clone, Copy)]
struct Layout {
    red_shift: u32,
    green_shift: u32,
    blue_shift: u32,
}

/// The agent's connection to the display.
pub struct Screen {
    conn: RustConnection,
    root: xproto::Window,
    /// Width in pixels.
    pub width: u16,
    /// Height in pixels.
    pub height: u16,
    layout: Layout,
    shm: Option<Segment>,
    /// The uid the segment must belong to for the server to attach it (a server not run as root).
    server_uid: Option<u32>,
    min_keycode: u8,
    max_keycode: u8,
    /// Keycodes given to characters the keymap lacked, keysym → keycode, with their last use.
    remapped: HashMap<u32, (u8, u64)>,
    uses: u64,
}

fn x_err(e: impl std::fmt::Display) -> String {
    format!("X11: {e}")
}

impl Screen {
    /// Connects to the display's Unix socket with `cookie`.
    pub fn connect(socket: &Path, cookie: &Cookie, server_uid: Option<u32>) -> Result<Screen, String> {
        let unix = UnixStream::connect(socket)
            .map_err(|e| format!("cannot reach the display at {}: {e}", socket.display()))?;
        let (stream, _) = DefaultStream::from_unix_stream(unix).map_err(x_err)?;
        let conn =
            RustConnection::connect_to_stream_with_auth_info(stream, 0, cookie.name.clone(), cookie.data.clone())
                .map_err(x_err)?;
        let setup = conn.setup();
        let screen = setup.roots.first().ok_or("X11: the display has no screen")?;
        let (root, width, height, depth) =
            (screen.root, screen.width_in_pixels, screen.height_in_pixels, screen.root_depth);
        let bpp = setup.pixmap_formats.iter().find(|f| f.depth == depth).map(|f| f.bits_per_pixel);
        let visual = screen
            .allowed_depths
            .iter()
            .flat_map(|d| d.visuals.iter())
            .find(|v| v.visual_id == screen.root_visual)
            .ok_or("X11: the root visual is not listed")?;
        if bpp != Some(32) || setup.image_byte_order != xproto::ImageOrder::LSB_FIRST {
            return Err(format!("X11: unsupported pixel format (depth {depth}, {bpp:?} bits a pixel)"));
        }
        let shift = |mask: u32| if mask == 0 || mask.count_ones() != 8 { None } else { Some(mask.trailing_zeros()) };
        let layout = match (shift(visual.red_mask), shift(visual.green_mask), shift(visual.blue_mask)) {
            (Some(r), Some(g), Some(b)) => Layout { red_shift: r, green_shift: g, blue_shift: b },
            _ => return Err("X11: the root visual is not 8 bits a colour".into()),
        };
        let (min_keycode, max_keycode) = (setup.min_keycode, setup.max_keycode);
        if conn.extension_information(xtest::X11_EXTENSION_NAME).map_err(x_err)?.is_none() {
            return Err("X11: the display has no XTEST extension".into());
        }
        let mut s = Screen {
            conn,
            root,
            width,
            height,
            layout,
            shm: None,
            server_uid,
            min_keycode,
            max_keycode,
            remapped: HashMap::new(),
            uses: 0,
        };
        s.shm = match s.attach_segment() {
            Ok(seg) => Some(seg),
            Err(why) => {
                tracing::info!(%why, "screenshots without MIT-SHM");
                None
            }
        };
        Ok(s)
    }

    /// Paints the root window one colour (`rgb`), as `xsetroot -solid` does: the background a
    /// new desktop shows, and what a closed window leaves behind.
    pub fn paint_background(&self, rgb: [u8; 3]) -> Result<(), String> {
        let l = &self.layout;
        let pixel =
            u32::from(rgb[0]) << l.red_shift | u32::from(rgb[1]) << l.green_shift | u32::from(rgb[2]) << l.blue_shift;
        let aux = xproto::ChangeWindowAttributesAux::new().background_pixel(pixel);
        self.conn.change_window_attributes(self.root, &aux).map_err(x_err)?.check().map_err(x_err)?;
        self.conn.clear_area(false, self.root, 0, 0, 0, 0).map_err(x_err)?.check().map_err(x_err)?;
        Ok(())
    }

    /// A segment for a whole screen, attached by the server.
    fn attach_segment(&self) -> Result<Segment, String> {
        if self.conn.extension_information(shm::X11_EXTENSION_NAME).map_err(x_err)?.is_none() {
            return Err("no MIT-SHM extension".into());
        }
        let size = usize::from(self.width) * usize::from(self.height) * 4;
        // SAFETY: plain System V calls; the mapping is checked before use and removed on drop.
        unsafe {
            let id = libc::shmget(libc::IPC_PRIVATE, size, libc::IPC_CREAT | 0o600);
            if id < 0 {
                return Err(format!("shmget: {}", std::io::Error::last_os_error()));
            }
            let addr = libc::shmat(id, std::ptr::null(), 0);
            if addr as isize == -1 {
                let e = std::io::Error::last_os_error();
                libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
                return Err(format!("shmat: {e}"));
            }
            // A server that is not root attaches the segment as its own account: it gets the
            // segment (still 0600, so no one else can read the screen from it).
            if let Some(uid) = self.server_uid {
                let mut ds: libc::shmid_ds = std::mem::zeroed();
                if libc::shmctl(id, libc::IPC_STAT, &mut ds) == 0 {
                    ds.shm_perm.uid = uid;
                    libc::shmctl(id, libc::IPC_SET, &mut ds);
                }
            }
            let detach = |why: String| {
                libc::shmdt(addr);
                libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
                why
            };
            let seg = self.conn.generate_id().map_err(|e| detach(x_err(e)))?;
            let attached =
                shm::attach(&self.conn, seg, id as u32, false).map_err(x_err).and_then(|c| c.check().map_err(x_err));
            // Gone once both sides detach.
            libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
            if let Err(e) = attached {
                libc::shmdt(addr);
                return Err(e);
            }
            Ok(Segment { seg, addr: addr.cast(), size })
        }
    }

    /// The whole screen, or `region` of it (checked against the screen).
    pub fn capture(&mut self, region: Option<Region>) -> Result<Picture, String> {
        let r = region.unwrap_or(Region { x: 0, y: 0, width: self.width.into(), height: self.height.into() });
        if r.width == 0 || r.height == 0 || r.x + r.width > self.width.into() || r.y + r.height > self.height.into() {
            return Err(format!("the region is outside the {}x{} screen", self.width, self.height));
        }
        let (x, y, w, h) = (r.x as i16, r.y as i16, r.width as u16, r.height as u16);
        let n = r.width as usize * r.height as usize;
        let mut rgb = Vec::with_capacity(n * 3);
        let via_shm = match &self.shm {
            Some(seg) => {
                shm::get_image(&self.conn, self.root, x, y, w, h, !0, xproto::ImageFormat::Z_PIXMAP.into(), seg.seg, 0)
                    .map_err(x_err)
                    .and_then(|c| c.reply().map_err(x_err))
                    .map(|_| {
                        // SAFETY: the server wrote `n` 4-byte pixels at offset 0 of the segment, which
                        // holds a whole screen; the reply came after the write.
                        let bytes = unsafe { std::slice::from_raw_parts(seg.addr, (n * 4).min(seg.size)) };
                        self.convert(bytes, &mut rgb);
                    })
            }
            None => Err("no segment".into()),
        };
        if via_shm.is_err() {
            let reply = xproto::get_image(&self.conn, xproto::ImageFormat::Z_PIXMAP, self.root, x, y, w, h, !0)
                .map_err(x_err)?
                .reply()
                .map_err(x_err)?;
            if reply.data.len() < n * 4 {
                return Err("X11: a short image".into());
            }
            self.convert(&reply.data[..n * 4], &mut rgb);
        }
        Ok(Picture { width: r.width, height: r.height, rgb })
    }

    fn convert(&self, bgrx: &[u8], rgb: &mut Vec<u8>) {
        let Layout { red_shift, green_shift, blue_shift } = self.layout;
        for p in bgrx.chunks_exact(4) {
            let v = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
            rgb.extend_from_slice(&[(v >> red_shift) as u8, (v >> green_shift) as u8, (v >> blue_shift) as u8]);
        }
    }

    /// How screenshots are taken: `mit-shm`, or `get-image` when the extension could not be used.
    pub fn capture_path(&self) -> &'static str {
        if self.shm.is_some() { "mit-shm" } else { "get-image" }
    }

    /// Whether every point of `actions` is on the screen (checked before anything is sent).
    pub fn check_points(&self, actions: &[Action]) -> Result<(), String> {
        for (i, a) in actions.iter().enumerate() {
            for p in a.points() {
                if p.x >= u32::from(self.width) || p.y >= u32::from(self.height) {
                    return Err(format!(
                        "action {i} ({}): ({}, {}) is outside the {}x{} screen",
                        a.kind(),
                        p.x,
                        p.y,
                        self.width,
                        self.height
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks that every key of `actions` can be typed (names known), before anything is sent.
    pub fn check_keys(actions: &[Action]) -> Result<(), String> {
        for (i, a) in actions.iter().enumerate() {
            if let Action::Key { keys } = a {
                keys::parse_combo(keys).map_err(|e| format!("action {i} (key): {e}"))?;
            }
        }
        Ok(())
    }

    fn fake(&self, kind: u8, detail: u8, x: i16, y: i16) -> Result<(), String> {
        xtest::fake_input(&self.conn, kind, detail, 0, self.root, x, y, 0).map_err(x_err)?;
        Ok(())
    }

    fn motion(&self, x: u32, y: u32) -> Result<(), String> {
        self.fake(xproto::MOTION_NOTIFY_EVENT, 0, x as i16, y as i16)
    }

    fn button(&self, b: u8) -> Result<(), String> {
        self.fake(xproto::BUTTON_PRESS_EVENT, b, 0, 0)?;
        self.fake(xproto::BUTTON_RELEASE_EVENT, b, 0, 0)
    }

    /// Waits until the server has handled everything sent so far.
    pub fn sync(&self) -> Result<(), String> {
        self.conn.get_input_focus().map_err(x_err)?.reply().map_err(x_err)?;
        Ok(())
    }

    /// After a click: a window manager takes a click on an unfocused window through a grab and
    /// moves the focus after it, so keys sent at once would reach the old focus. Waits until the
    /// input focus has stayed the same for [`FOCUS_QUIET`] (at most [`FOCUS_WAIT`]).
    fn settle_focus(&self) -> Result<(), String> {
        let start = std::time::Instant::now();
        let mut last = (self.conn.get_input_focus().map_err(x_err)?.reply().map_err(x_err)?.focus, start);
        while start.elapsed() < FOCUS_WAIT {
            std::thread::sleep(Duration::from_millis(5));
            let now = self.conn.get_input_focus().map_err(x_err)?.reply().map_err(x_err)?.focus;
            if now != last.0 {
                last = (now, std::time::Instant::now());
            } else if last.1.elapsed() >= FOCUS_QUIET {
                break;
            }
        }
        Ok(())
    }

    /// Sends one action (its points were checked) and waits until the server has handled it.
    pub fn act(&mut self, a: &Action) -> Result<(), String> {
        match a {
            Action::Move { x, y } => self.motion(*x, *y)?,
            Action::Click { x, y, button, count } => {
                if let (Some(x), Some(y)) = (x, y) {
                    self.motion(*x, *y)?;
                }
                for _ in 0..*count {
                    self.button(button.number())?;
                }
                self.settle_focus()?;
            }
            Action::Drag { from, to, button } => {
                self.motion(from.x, from.y)?;
                self.fake(xproto::BUTTON_PRESS_EVENT, button.number(), 0, 0)?;
                self.sync()?;
                // Through points between, so a program that follows the motion sees a drag.
                const STEPS: i64 = 8;
                for i in 1..=STEPS {
                    let at = |a: u32, b: u32| (i64::from(a) + (i64::from(b) - i64::from(a)) * i / STEPS) as u32;
                    self.motion(at(from.x, to.x), at(from.y, to.y))?;
                    self.sync()?;
                    std::thread::sleep(Duration::from_millis(5));
                }
                self.fake(xproto::BUTTON_RELEASE_EVENT, button.number(), 0, 0)?;
                self.settle_focus()?;
            }
            Action::Scroll { x, y, dx, dy } => {
                if let (Some(x), Some(y)) = (x, y) {
                    self.motion(*x, *y)?;
                }
                let (v, h) = (if *dy > 0 { 5 } else { 4 }, if *dx > 0 { 7 } else { 6 });
                for _ in 0..dy.unsigned_abs() {
                    self.button(v)?;
                }
                for _ in 0..dx.unsigned_abs() {
                    self.button(h)?;
                }
            }
            Action::Type { text } => {
                let syms: Vec<u32> = text.chars().map(keys::char_keysym).collect();
                // A piece at a time: its missing keysyms are mapped first, all at once, so the
                // mapping holds still while its keys are typed.
                for piece in syms.chunks(TYPE_PIECE) {
                    self.prepare(piece)?;
                    for k in piece {
                        self.press_keysym(*k, &[])?;
                    }
                }
            }
            Action::Key { keys: spec } => {
                let combo = keys::parse_combo(spec)?;
                self.prepare(&[combo.key])?;
                self.press_keysym(combo.key, &combo.modifiers)?;
            }
            Action::Wait { ms } => {
                self.sync()?;
                std::thread::sleep(Duration::from_millis(u64::from(*ms)));
            }
        }
        self.sync()
    }

    /// The keyboard mapping: keysyms per keycode, and the keysyms from `min_keycode` on.
    fn mapping(&self) -> Result<(usize, Vec<u32>), String> {
        let count = self.max_keycode - self.min_keycode + 1;
        let m = self.conn.get_keyboard_mapping(self.min_keycode, count).map_err(x_err)?.reply().map_err(x_err)?;
        Ok((usize::from(m.keysyms_per_keycode), m.keysyms))
    }

    /// The keycode that gives `keysym`, and whether it needs Shift, from the current mapping.
    fn find(&self, per: usize, syms: &[u32], keysym: u32) -> Option<(u8, bool)> {
        if per == 0 {
            return None;
        }
        for (i, row) in syms.chunks(per).enumerate() {
            for (col, s) in row.iter().take(2).enumerate() {
                if *s == keysym {
                    return Some((self.min_keycode + i as u8, col == 1));
                }
            }
        }
        None
    }

    /// Gives `keysym` a keycode: one remapped before for it, else a spare keycode (no keysyms),
    /// else the least recently used remapped one.
    fn remap(&mut self, per: usize, syms: &[u32], keysym: u32) -> Result<u8, String> {
        let in_use: std::collections::HashSet<u8> = self.remapped.values().map(|(k, _)| *k).collect();
        let spare = syms
            .chunks(per)
            .enumerate()
            .map(|(i, row)| (self.min_keycode + i as u8, row))
            .find(|(k, row)| !in_use.contains(k) && row.iter().all(|s| *s == 0))
            .map(|(k, _)| k);
        let code = match spare {
            Some(k) => k,
            None => {
                let (&old, &(k, _)) = self
                    .remapped
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .ok_or("no keycode is free to type this character")?;
                self.remapped.remove(&old);
                // A program may still be reading the keysym it had: give it time before the
                // keycode changes meaning.
                std::thread::sleep(Duration::from_millis(50));
                k
            }
        };
        let mut row = vec![0u32; per.max(2)];
        row[0] = keysym;
        row[1] = keysym;
        self.conn.change_keyboard_mapping(1, code, row.len() as u8, &row).map_err(x_err)?.check().map_err(x_err)?;
        self.remapped.insert(keysym, (code, self.uses));
        Ok(code)
    }

    /// Gives every keysym of `keysyms` the current mapping lacks a keycode of its own, then
    /// lets the display's programs see the new mapping before any key is pressed: they learn of
    /// it from a MappingNotify and fetch it when they next look a key up.
    fn prepare(&mut self, keysyms: &[u32]) -> Result<(), String> {
        let (per, syms) = self.mapping()?;
        // The current mapping decides (a keymap change, e.g. setxkbmap, may have taken back
        // keycodes remapped before).
        let (min, row) = (self.min_keycode, per);
        self.remapped.retain(|ks, (kc, _)| syms.get(usize::from(*kc - min) * row) == Some(ks));
        let mut changed = false;
        let mut seen = std::collections::HashSet::new();
        for k in keysyms {
            self.uses += 1;
            if !seen.insert(*k) {
                continue;
            }
            if let Some(entry) = self.remapped.get_mut(k) {
                entry.1 = self.uses;
                continue;
            }
            if self.find(per, &syms, *k).is_none() {
                self.remap(per, &syms, *k)?;
                changed = true;
            }
        }
        if changed {
            self.sync()?;
            std::thread::sleep(REMAP_SETTLE);
        }
        Ok(())
    }

    /// Presses and releases `keysym` (mapped by [`Screen::prepare`]) with `modifiers` held (and
    /// Shift when its keycode needs it).
    fn press_keysym(&mut self, keysym: u32, modifiers: &[u32]) -> Result<(), String> {
        let (per, syms) = self.mapping()?;
        let (code, shift) = self
            .find(per, &syms, keysym)
            .ok_or_else(|| format!("the keysym {keysym:#x} lost its keycode while typing"))?;
        let mut held = Vec::new();
        for m in modifiers {
            let (k, _) =
                self.find(per, &syms, *m).ok_or_else(|| format!("the keymap has no modifier keysym {m:#x}"))?;
            held.push(k);
        }
        if shift && !modifiers.contains(&keys::SHIFT_L) {
            let (k, _) = self.find(per, &syms, keys::SHIFT_L).ok_or("the keymap has no Shift")?;
            held.push(k);
        }
        for k in &held {
            self.fake(xproto::KEY_PRESS_EVENT, *k, 0, 0)?;
        }
        self.fake(xproto::KEY_PRESS_EVENT, code, 0, 0)?;
        self.fake(xproto::KEY_RELEASE_EVENT, code, 0, 0)?;
        for k in held.iter().rev() {
            self.fake(xproto::KEY_RELEASE_EVENT, *k, 0, 0)?;
        }
        self.conn.flush().map_err(x_err)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        if let Some(seg) = self.shm.take() {
            let _ = shm::detach(&self.conn, seg.seg);
            let _ = self.conn.flush();
            // SAFETY: the mapping came from shmat and is not used after this.
            unsafe {
                libc::shmdt(seg.addr.cast());
            }
        }
    }
}
