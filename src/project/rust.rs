//! Rust's tests live inside its sources too: `#[cfg(test)] mod tests { ... }`, a `#[test] fn`.
//! Changing one of those is changing the tests, as much as editing a file under `tests/`.
//!
//! The rule, kept simple so it is predictable: the *test code* of a `.rs` file is every item
//! carrying a test attribute — `#[cfg(test)]` (or a `cfg` that mentions `test` without `not`),
//! `#[test]`, `#[tokio::test]` and the like — from the attribute to the end of the item (its
//! closing brace, or the `;` of `mod tests;`), plus the whole file under `#![cfg(test)]`. Two
//! versions of a file have different tests when their lists of test-code texts differ: an
//! edited, removed, added or commented-out test all count. `--protect-tests` refuses such an
//! edit; `eval` counts it as a changed test.
//!
//! A small lexer skips comments, strings (raw ones too), char literals and lifetimes, so a
//! `#[test]` inside a string or a comment is not taken for one.

use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    Ident,
    Lit,
    Punct(u8),
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c >= 0x80
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

/// Tokens with their byte ranges; whitespace and comments dropped.
fn tokens(src: &str) -> Vec<(Tok, Range<usize>)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            continue;
        }
        if is_ident_start(c) {
            while i < b.len() && is_ident_char(b[i]) {
                i += 1;
            }
            let word = &b[start..i];
            // Raw and byte strings: r"..", r#".."#, br"..", b"..", c"..", cr#".."#.
            let raw = matches!(word, b"r" | b"br" | b"cr");
            if raw && matches!(b.get(i), Some(b'"') | Some(b'#')) {
                let mut hashes = 0;
                while b.get(i + hashes) == Some(&b'#') {
                    hashes += 1;
                }
                if b.get(i + hashes) == Some(&b'"') {
                    i += hashes + 1;
                    loop {
                        if i >= b.len() {
                            break;
                        }
                        if b[i] == b'"'
                            && b[i + 1..].iter().take(hashes).filter(|&&h| h == b'#').count() == hashes
                        {
                            i += 1 + hashes;
                            break;
                        }
                        i += 1;
                    }
                    out.push((Tok::Lit, start..i));
                    continue;
                }
                if word == b"r" && hashes == 1 && b.get(i + 1).is_some_and(|&c| is_ident_start(c)) {
                    // r#ident: a raw identifier.
                    i += 1;
                    while i < b.len() && is_ident_char(b[i]) {
                        i += 1;
                    }
                    out.push((Tok::Ident, start..i));
                    continue;
                }
            }
            if matches!(word, b"b" | b"c") && b.get(i) == Some(&b'"') {
                i = skip_quoted(b, i, b'"');
                out.push((Tok::Lit, start..i));
                continue;
            }
            if word == b"b" && b.get(i) == Some(&b'\'') {
                i = skip_quoted(b, i, b'\'');
                out.push((Tok::Lit, start..i));
                continue;
            }
            out.push((Tok::Ident, start..i));
            continue;
        }
        if c == b'"' {
            i = skip_quoted(b, i, b'"');
            out.push((Tok::Lit, start..i));
            continue;
        }
        if c == b'\'' {
            // A char literal ('a', '\n', 'é') or a lifetime ('a, 'static).
            if b.get(i + 1) == Some(&b'\\') {
                i = skip_quoted(b, i, b'\'');
                out.push((Tok::Lit, start..i));
                continue;
            }
            let ch_len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
            if b.get(i + 1 + ch_len) == Some(&b'\'') {
                i += ch_len + 2;
                out.push((Tok::Lit, start..i));
                continue;
            }
            i += 1;
            while i < b.len() && is_ident_char(b[i]) {
                i += 1;
            }
            out.push((Tok::Ident, start..i));
            continue;
        }
        if c.is_ascii_digit() {
            while i < b.len()
                && (is_ident_char(b[i]) || (b[i] == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)))
            {
                i += 1;
            }
            out.push((Tok::Lit, start..i));
            continue;
        }
        i += 1;
        out.push((Tok::Punct(c), start..i));
    }
    out
}

/// The index just past the closing `quote` of the literal opening at `i`, escapes skipped.
fn skip_quoted(b: &[u8], mut i: usize, quote: u8) -> usize {
    i += 1;
    while i < b.len() && b[i] != quote {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    (i + 1).min(b.len())
}

/// The index of the token that closes the bracket opened at token `open`.
fn matching(toks: &[(Tok, Range<usize>)], open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (k, (t, _)) in toks.iter().enumerate().skip(open) {
        match t {
            Tok::Punct(b'(' | b'[' | b'{') => depth += 1,
            Tok::Punct(b')' | b']' | b'}') => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// Does the attribute text (between `[` and `]`, whitespace removed) mark test code?
fn is_test_attribute(inner: &str) -> bool {
    if inner == "test" || inner.ends_with("::test") {
        return true;
    }
    let Some(args) = inner.strip_prefix("cfg(") else {
        return false;
    };
    let words: Vec<&str> = args
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    words.contains(&"test") && !words.contains(&"not")
}

/// The byte ranges of `src` that are test code (see the module doc), in order.
pub fn test_regions(src: &str) -> Vec<Range<usize>> {
    let toks = tokens(src);
    let mut regions = Vec::new();
    let mut k = 0;
    while k < toks.len() {
        if toks[k].0 != Tok::Punct(b'#') {
            k += 1;
            continue;
        }
        let inner_attr = toks.get(k + 1).is_some_and(|t| t.0 == Tok::Punct(b'!'));
        let open = k + 1 + usize::from(inner_attr);
        if toks.get(open).map(|t| t.0) != Some(Tok::Punct(b'[')) {
            k += 1;
            continue;
        }
        let Some(close) = matching(&toks, open) else { break };
        let text: String = src[toks[open].1.end..toks[close].1.start]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if !is_test_attribute(&text) {
            k = close + 1;
            continue;
        }
        if inner_attr {
            #[allow(clippy::single_range_in_vec_init, reason = "one region: the whole file")]
            return vec![0..src.len()];
        }
        // The item the attribute belongs to: up to the `;` or the closing brace at its level.
        let start = toks[k].1.start;
        let mut j = close + 1;
        let mut end = src.len();
        while j < toks.len() {
            match toks[j].0 {
                Tok::Punct(b';') => {
                    end = toks[j].1.end;
                    break;
                }
                Tok::Punct(b'{') => {
                    end = matching(&toks, j).map_or(src.len(), |m| toks[m].1.end);
                    break;
                }
                Tok::Punct(b'(' | b'[') => match matching(&toks, j) {
                    Some(m) => j = m + 1,
                    None => break,
                },
                _ => j += 1,
            }
        }
        regions.push(start..end);
        k = toks.iter().position(|t| t.1.start >= end).unwrap_or(toks.len());
    }
    regions
}

/// The test code of `src`, as text, in order.
pub fn test_code(src: &str) -> Vec<&str> {
    test_regions(src).into_iter().map(|r| &src[r]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: &str = r##"
/// Adds. `#[test]` in a doc comment is no attribute.
pub fn add(a: i32, b: i32) -> i32 {
    let s = "#[cfg(test)] mod fake { }";
    let r = r#"#[test] "quoted" fn x() {}"#;
    let c = '{';
    a + b
}

#[derive(Debug)]
struct Plain<'a>(&'a str);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds() {
        assert_eq!(add(1, 2), 3, "{}", '}');
    }
}

#[cfg(not(test))]
fn only_outside_tests() {}

#[cfg(all(test, feature = "slow"))]
#[path = "slow_tests.rs"]
mod slow;

#[tokio::test]
async fn top_level() { let v: [u8; 2] = [1, 2]; }
"##;

    #[test]
    fn finds_test_modules_functions_and_out_of_line_modules() {
        let code = test_code(LIB);
        assert_eq!(code.len(), 3, "{code:#?}");
        assert!(
            code[0].starts_with("#[cfg(test)]\nmod tests {") && code[0].ends_with("}\n}"),
            "{}",
            code[0]
        );
        assert_eq!(
            code[1],
            "#[cfg(all(test, feature = \"slow\"))]\n#[path = \"slow_tests.rs\"]\nmod slow;"
        );
        assert!(
            code[2].starts_with("#[tokio::test]") && code[2].ends_with("[1, 2]; }"),
            "{}",
            code[2]
        );
    }

    #[test]
    fn a_whole_file_under_cfg_test() {
        let src = "#![cfg(test)]\nuse super::*;\n#[test]\nfn t() {}\n";
        assert_eq!(test_code(src), [src]);
        assert!(test_regions("//! docs\nfn main() {}\n").is_empty());
    }

    #[test]
    fn editing_inside_a_test_changes_the_test_code_and_editing_outside_does_not() {
        let fixed_code = LIB.replace("    a + b\n", "    a.wrapping_add(b)\n");
        assert_eq!(test_code(LIB), test_code(&fixed_code));
        let weakened = LIB.replace("assert_eq!(add(1, 2), 3", "assert_eq!(add(1, 2), add(1, 2)");
        assert_ne!(test_code(LIB), test_code(&weakened));
        // Commenting the module out leaves its text alone but removes it as code.
        let hidden = LIB
            .replace("#[cfg(test)]\nmod tests {", "/*\n#[cfg(test)]\nmod tests {")
            .replace("#[cfg(not(test))]", "*/\n#[cfg(not(test))]");
        assert_ne!(test_code(LIB), test_code(&hidden));
    }

    #[test]
    fn lexing_survives_odd_input() {
        for src in [
            "#[cfg(test)",
            "#[test] fn f() {",
            "r#\"open",
            "'",
            "/* open",
            "#",
            "b'\\",
        ] {
            let _ = test_regions(src);
        }
        assert_eq!(
            test_regions("#[test] fn f() {").len(),
            1,
            "an unclosed item runs to the end"
        );
    }
}
