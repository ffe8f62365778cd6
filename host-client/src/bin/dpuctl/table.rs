//! Aligned plain-text tables for people.

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

    /// Adds a row (missing cells print empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
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

/// `key: value` lines for one object.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| format!("{k:<w$}  {v}\n", k = format!("{k}:"), w = w + 1))
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
}
