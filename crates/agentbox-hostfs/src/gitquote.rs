//! Path names the way git prints them (`quote_c_style`): a name with a control character, a
//! `"` or a `\` is put in double quotes with C escapes, so no file name can start a new line
//! in a patch, a change list or a warning. Valid UTF-8 stays readable (git's
//! `core.quotePath=false`, as the in-sandbox diff is configured); other bytes ≥ 0x80 become
//! octal escapes.

pub fn quote_path(name: &[u8]) -> String {
    let utf8 = std::str::from_utf8(name).ok();
    let needs = |b: u8| b < 0x20 || b == b'"' || b == b'\\' || b == 0x7f || (utf8.is_none() && b >= 0x80);
    if !name.iter().any(|&b| needs(b)) {
        return utf8.map(str::to_string).unwrap_or_default();
    }
    let mut out = String::from("\"");
    let mut rest = name;
    while let Some((&b, tail)) = rest.split_first() {
        match b {
            0x07 => out.push_str("\\a"),
            0x08 => out.push_str("\\b"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x0b => out.push_str("\\v"),
            0x0c => out.push_str("\\f"),
            b'\r' => out.push_str("\\r"),
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b if needs(b) => out.push_str(&format!("\\{b:03o}")),
            _ if b >= 0x80 => {
                // A whole UTF-8 character (the name is valid UTF-8 here).
                let len = match b {
                    0xf0.. => 4,
                    0xe0.. => 3,
                    _ => 2,
                };
                let (ch, after) = rest.split_at(len.min(rest.len()));
                out.push_str(&String::from_utf8_lossy(ch));
                rest = after;
                continue;
            }
            b => out.push(b as char),
        }
        rest = tail;
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_as_git_quotes_them() {
        assert_eq!(quote_path(b"src/a.py"), "src/a.py");
        assert_eq!(quote_path("café/ü.txt".as_bytes()), "café/ü.txt");
        assert_eq!(quote_path(b"a\nb"), "\"a\\nb\"");
        assert_eq!(quote_path(b"tab\there \"q\" \\"), "\"tab\\there \\\"q\\\" \\\\\"");
        assert_eq!(quote_path(b"\x1b[31mred"), "\"\\033[31mred\"");
        assert_eq!(quote_path(b"bad\xff"), "\"bad\\377\"");
        assert_eq!(quote_path("é\n".as_bytes()), "\"é\\n\"");
    }
}
