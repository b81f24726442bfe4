//! Keys by name and characters as X keysyms: what `key` combinations (`ctrl+l`, `shift+Tab`)
//! and `type` text become before they are looked up in the display's own keymap.

/// `Shift_L`.
pub const SHIFT_L: u32 = 0xffe1;
/// `Control_L`.
pub const CONTROL_L: u32 = 0xffe3;
/// `Alt_L`.
pub const ALT_L: u32 = 0xffe9;
/// `Super_L`.
pub const SUPER_L: u32 = 0xffeb;
/// `Return`.
pub const RETURN: u32 = 0xff0d;
/// `Tab`.
pub const TAB: u32 = 0xff09;

/// The keysym of a character: Latin-1 characters are their own keysym, `\n` and `\t` are Return
/// and Tab, and every other character its Unicode keysym (`0x01000000 + code point`, which Xlib
/// turns back into the character).
pub fn char_keysym(c: char) -> u32 {
    match c {
        '\n' => RETURN,
        '\t' => TAB,
        ' '..='~' | '\u{a0}'..='\u{ff}' => c as u32,
        _ => 0x0100_0000 + c as u32,
    }
}

/// Named keys (lower case) and their keysyms.
const NAMED: &[(&str, u32)] = &[
    ("return", RETURN),
    ("enter", RETURN),
    ("tab", TAB),
    ("space", 0x20),
    ("backspace", 0xff08),
    ("escape", 0xff1b),
    ("esc", 0xff1b),
    ("delete", 0xffff),
    ("del", 0xffff),
    ("insert", 0xff63),
    ("home", 0xff50),
    ("end", 0xff57),
    ("left", 0xff51),
    ("up", 0xff52),
    ("right", 0xff53),
    ("down", 0xff54),
    ("pageup", 0xff55),
    ("page_up", 0xff55),
    ("prior", 0xff55),
    ("pagedown", 0xff56),
    ("page_down", 0xff56),
    ("next", 0xff56),
    ("menu", 0xff67),
    ("print", 0xff61),
    ("plus", 0x2b),
    ("minus", 0x2d),
    ("shift", SHIFT_L),
    ("shift_l", SHIFT_L),
    ("ctrl", CONTROL_L),
    ("control", CONTROL_L),
    ("control_l", CONTROL_L),
    ("alt", ALT_L),
    ("alt_l", ALT_L),
    ("super", SUPER_L),
    ("super_l", SUPER_L),
    ("meta", SUPER_L),
    ("cmd", SUPER_L),
    ("win", SUPER_L),
];

/// The modifiers a combination may name before its key.
fn modifier(name: &str) -> Option<u32> {
    match name.to_ascii_lowercase().as_str() {
        "shift" => Some(SHIFT_L),
        "ctrl" | "control" => Some(CONTROL_L),
        "alt" => Some(ALT_L),
        "super" | "meta" | "cmd" | "win" => Some(SUPER_L),
        _ => None,
    }
}

/// The keysym of one key's name: a named key (any case), `F1`..`F24`, or a single character.
pub fn key_keysym(name: &str) -> Option<u32> {
    let lower = name.to_ascii_lowercase();
    if let Some((_, k)) = NAMED.iter().find(|(n, _)| *n == lower) {
        return Some(*k);
    }
    if let Some(n) = lower.strip_prefix('f').and_then(|n| n.parse::<u32>().ok())
        && (1..=24).contains(&n)
    {
        return Some(0xffbe + n - 1);
    }
    let mut chars = name.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if !c.is_control() => Some(char_keysym(c)),
        _ => None,
    }
}

/// A combination: modifiers held while `key` is pressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Combo {
    /// Held, in order.
    pub modifiers: Vec<u32>,
    /// Pressed.
    pub key: u32,
}

/// Parses `ctrl+shift+t`, `Return`, `alt+F4`, `ctrl++` (the `+` key).
pub fn parse_combo(spec: &str) -> Result<Combo, String> {
    let spec = spec.trim();
    let (head, last) = if let Some(h) = spec.strip_suffix("++") {
        (h, "+")
    } else if spec == "+" {
        ("", "+")
    } else {
        match spec.rsplit_once('+') {
            Some((h, k)) => (h, k),
            None => ("", spec),
        }
    };
    let mut modifiers = Vec::new();
    for m in head.split('+').filter(|m| !m.is_empty()) {
        modifiers.push(modifier(m.trim()).ok_or_else(|| format!("{m:?} is not a modifier (shift, ctrl, alt, super)"))?);
    }
    let key = key_keysym(last.trim()).ok_or_else(|| format!("unknown key {last:?}"))?;
    Ok(Combo { modifiers, key })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_and_names_become_keysyms() {
        assert_eq!(char_keysym('a'), 0x61);
        assert_eq!(char_keysym('é'), 0xe9);
        assert_eq!(char_keysym('€'), 0x0100_20ac);
        assert_eq!(char_keysym('\n'), RETURN);
        assert_eq!(key_keysym("F5"), Some(0xffc2));
        assert_eq!(key_keysym("Return"), Some(RETURN));
        assert_eq!(key_keysym("ö"), Some(0xf6));
        assert_eq!(key_keysym("nope"), None);
        assert_eq!(parse_combo("ctrl+l"), Ok(Combo { modifiers: vec![CONTROL_L], key: 0x6c }));
        assert_eq!(parse_combo("Ctrl+Shift+Tab"), Ok(Combo { modifiers: vec![CONTROL_L, SHIFT_L], key: TAB }));
        assert_eq!(parse_combo("ctrl++"), Ok(Combo { modifiers: vec![CONTROL_L], key: 0x2b }));
        assert_eq!(parse_combo("+"), Ok(Combo { modifiers: vec![], key: 0x2b }));
        assert!(parse_combo("hyper+x").is_err());
        assert!(parse_combo("ctrl+nothing").is_err());
    }
}
