//! Aligned plain-text tables for people, and the escaping that keeps what
//! the service returns from acting on the terminal that shows it.

use std::borrow::Cow;
use std::fmt::Write;

/// True for what a terminal may act on rather than show: control
/// characters (C0, DEL, C1, which start escape sequences) and the Unicode
/// bidirectional overrides and isolates, which reorder what follows them.
fn unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every character a terminal may act on written as an escape
/// (`\x1b`, `\n`, `\u{202e}`), so that a value another API client stored
/// can neither move the cursor, recolour, retitle or rewrite an
/// operator's terminal, nor break a table's lines.
pub fn escape(s: &str) -> Cow<'_, str> {
    escape_but(s, None)
}

/// [`escape`] for whole output: keeps the line breaks of dpuctl's own
/// layout (values in it were escaped where they were put in).
pub fn terminal_safe(s: &str) -> Cow<'_, str> {
    escape_but(s, Some('\n'))
}

/// Serialized JSON with the characters a terminal may act on that
/// serde_json leaves as they are (DEL, C1, bidirectional overrides; it
/// escapes C0 itself) written as JSON escapes (`\u009b`): the same JSON
/// value, safe to print. They can only occur inside strings, where the
/// escape means the same character.
pub fn json_safe(json: &str) -> Cow<'_, str> {
    if !json.chars().any(|c| unsafe_char(c) && c != '\n') {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if unsafe_char(c) && c != '\n' {
            // All such characters are in the Basic Multilingual Plane.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn escape_but(s: &str, keep: Option<char>) -> Cow<'_, str> {
    if !s.chars().any(|c| unsafe_char(c) && Some(c) != keep) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if Some(c) == keep || !unsafe_char(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(out)
}

/// A table: a header row and data rows, printed with aligned columns.
#[derive(Debug, Default)]
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells print empty); control characters in
    /// cells are escaped ([`escape`]).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(
            cells
                .into_iter()
                .map(|c| match escape(&c) {
                    Cow::Borrowed(_) => c,
                    Cow::Owned(e) => e,
                })
                .collect(),
        );
    }

    /// The table as text, one line per row, columns separated by two spaces.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.len()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                if i < widths.len() {
                    widths[i] = widths[i].max(c.chars().count());
                }
            }
        }
        let mut out = String::new();
        let mut line = |cells: Vec<&str>| {
            let mut l = String::new();
            for (i, w) in widths.iter().enumerate() {
                let c = cells.get(i).copied().unwrap_or("");
                if i + 1 == widths.len() {
                    l.push_str(c);
                } else {
                    l.push_str(&format!("{c:<w$}  "));
                }
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        line(self.headers.clone());
        for r in &self.rows {
            line(r.iter().map(String::as_str).collect());
        }
        out
    }
}

/// `key: value` lines for one object; control characters in values are
/// escaped ([`escape`]).
pub fn fields(pairs: &[(&str, String)]) -> String {
    let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| {
            format!(
                "{k:<w$}  {v}\n",
                k = format!("{k}:"),
                v = escape(v),
                w = w + 1
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(&["A", "LONGER"]);
        t.row(vec!["wide cell".into(), "x".into()]);
        t.row(vec!["y".into()]);
        assert_eq!(t.render(), "A          LONGER\nwide cell  x\ny\n");
    }

    #[test]
    fn key_values() {
        assert_eq!(
            fields(&[("a", "1".into()), ("long", "2".into())]),
            "a:     1\nlong:  2\n"
        );
    }

    #[test]
    fn control_characters_are_escaped() {
        // Retitle the window, clear the screen, C1 CSI, a bidi override.
        let hostile = "a\x1b]0;pwned\x07b\x1b[2J\u{9b}31m\r\n\u{202e}z\u{7f}";
        let want = "a\\x1b]0;pwned\\x07b\\x1b[2J\\x9b31m\\r\\n\\u{202e}z\\x7f";
        assert_eq!(escape(hostile), want);
        assert_eq!(terminal_safe("x\ny\x1b"), "x\ny\\x1b");
        assert!(matches!(escape("plain, ünïcode"), Cow::Borrowed(_)));
        let mut t = Table::new(&["A", "B"]);
        t.row(vec![hostile.into(), "x".into()]);
        let text = t.render();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            !text.chars().any(|c| c != '\n' && unsafe_char(c)),
            "{text:?}"
        );
        let json = serde_json::to_string_pretty(&serde_json::json!({ "v": hostile })).unwrap();
        let safe = json_safe(&json);
        assert!(!safe.chars().any(|c| c != '\n' && unsafe_char(c)), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back["v"], hostile);
        let f = fields(&[("name", hostile.into())]);
        assert_eq!(f, format!("name:  {want}\n"));
    }
}
