//! One failing test at a time, for a repair candidate: the test's own failure, its code, and
//! the code it calls, put after the files in the prompt. A 1.5B model shown every failure of a
//! project with two bugs fixes the one it notices first and gives the other back unchanged,
//! every time at temperature 0 (the demo: `fee // 2` fixed, `days_late` left off by one);
//! asked about one test, with the function it calls beside it, it looks there. Read from the
//! text only (no parser), for any language: a test is found by its name's last part, a
//! function by a definition keyword before its name, a block by its indentation.

use super::localise::Localised;

/// Lines of a test or function shown at most.
const MAX_BLOCK_LINES: usize = 40;
/// Functions the test calls shown at most.
const MAX_CALLED: usize = 3;
/// Bytes of one test's failure shown at most.
const MAX_SECTION: usize = 2000;

/// The failing tests of `names` in the order the output first mentions them (the runner's
/// order, usually the file's); names it never mentions go last, in their own order.
pub fn in_output_order<'a>(failing: &str, names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut found: Vec<(usize, String)> = names
        .into_iter()
        .map(|n| {
            let short = short_name(n);
            let at = if short.is_empty() {
                None
            } else {
                failing.find(short)
            };
            (at.unwrap_or(usize::MAX), n.clone())
        })
        .collect();
    found.sort_by_key(|(at, _)| *at);
    found.into_iter().map(|(_, n)| n).collect()
}

/// The part of a runner's test name that the test's source holds: `file.py::Class::test_x[1]`
/// → `test_x`, `tests::parses` → `parses`, `TestParse/empty` → `TestParse`.
pub fn short_name(name: &str) -> &str {
    let name = name.split('[').next().unwrap_or(name);
    let name = name.split('/').next().unwrap_or(name);
    let name = name.rsplit("::").next().unwrap_or(name);
    let name = name.rsplit('.').next().unwrap_or(name);
    name.trim()
}

/// The prompt's paragraph about failing test `name` of the project `loc` shows.
pub fn paragraph(loc: &Localised, name: &str) -> String {
    let short = short_name(name);
    let mut s = format!("\nStart with one failing test: `{name}`.\n");
    if let Some(section) = section(&loc.failing, short) {
        s.push_str(&format!("How it fails:\n```\n{}\n```\n", section.trim_end()));
    }
    let test = loc
        .shown
        .iter()
        .filter(|f| f.test)
        .chain(loc.shown.iter().filter(|f| !f.test))
        .find_map(|f| definition(&f.text, short).map(|b| (f.path.clone(), b)));
    let Some((path, code)) = test else {
        s.push_str("Find the code this test exercises in the source files above and fix the bug it shows.\n");
        return s;
    };
    s.push_str(&format!("The test, in {path}:\n```\n{code}\n```\n"));
    let called = called(loc, &code, short);
    if !called.is_empty() {
        let names: Vec<String> = called.iter().map(|(_, n, _)| format!("`{n}`")).collect();
        s.push_str(&format!(
            "It calls {}; as the source files above have {}:\n",
            names.join(", "),
            if called.len() == 1 { "it" } else { "them" }
        ));
        for (path, _, code) in &called {
            s.push_str(&format!("### {path}\n```\n{code}\n```\n"));
        }
        s.push_str(
            "Work out what this code returns for the test's inputs, find the line that makes it differ \
             from what the test expects, and fix it (and any other bug you see).\n",
        );
    } else {
        s.push_str("Find the code this test exercises in the source files above and fix the bug it shows.\n");
    }
    s
}

/// The failing output's section about test `short`: pytest's `____ test_x ____` block, libtest's
/// `---- name stdout ----` block, Go's `--- FAIL: Name` with the lines indented under it.
/// `None` when the output has no such section (the runner's format is not known).
pub fn section(failing: &str, short: &str) -> Option<String> {
    if short.is_empty() {
        return None;
    }
    let lines: Vec<&str> = failing.lines().collect();
    let is_header = |l: &str| {
        let t = l.trim();
        (t.starts_with("___") && t.ends_with("___")) || (t.starts_with("---- ") && t.ends_with(" ----"))
    };
    let names_it = |l: &str| {
        let t = l.trim().trim_matches(|c| c == '_' || c == '-' || c == ' ');
        let t = t.strip_suffix(" stdout").unwrap_or(t);
        t == short || t.ends_with(&format!(".{short}")) || t.ends_with(&format!("::{short}"))
    };
    let start = lines.iter().position(|l| is_header(l) && names_it(l));
    let body: Vec<&str> = if let Some(start) = start {
        lines[start..]
            .iter()
            .enumerate()
            .take_while(|(i, l)| {
                *i == 0
                    || !(is_header(l)
                        || l.starts_with("=====")
                        || l.starts_with("failures:")
                        || l.starts_with("FAILED ")
                        || l.starts_with("test result:"))
            })
            .map(|(_, l)| *l)
            .collect()
    } else {
        let go = format!("--- FAIL: {short}");
        let start = lines.iter().position(|l| l.trim_start().starts_with(&go))?;
        let indent = indent_of(lines[start]);
        lines[start..]
            .iter()
            .enumerate()
            .take_while(|(i, l)| *i == 0 || indent_of(l) > indent || l.trim().is_empty())
            .map(|(_, l)| *l)
            .collect()
    };
    let mut text = body.join("\n");
    if text.len() > MAX_SECTION {
        let mut cut = MAX_SECTION;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("\n[...]");
    }
    (!text.trim().is_empty()).then_some(text)
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The block that defines `name` in `text`: from the line with a definition keyword (`def`,
/// `fn`, `func`, `function`) before `name(` — or, for tests named by a string (`test("name",
/// ...)`, `it('name'`), the line with the quoted name — through the lines indented deeper, and
/// a closing line at its own indentation (`}`, `});`).
pub fn definition(text: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let (first, end) = definition_lines(&lines, name)?;
    let block: Vec<&str> = lines[first..end].to_vec();
    let text = block.join("\n");
    Some(text.trim_end().to_string())
}

/// [`definition`]'s block as line indices of `lines`: the first (a decorator or attribute
/// when there is one) and one past the last.
pub fn definition_lines(lines: &[&str], name: &str) -> Option<(usize, usize)> {
    if name.is_empty() {
        return None;
    }
    let defines = |l: &str| {
        ["def ", "fn ", "func ", "function "].iter().any(|k| {
            l.match_indices(&format!("{k}{name}")).any(|(at, m)| {
                let before_ok = at == 0 || !l[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
                let after = &l[at + m.len()..];
                before_ok && (after.starts_with('(') || after.starts_with('<'))
            })
        }) || [format!("\"{name}\""), format!("'{name}'"), format!("`{name}`")]
            .iter()
            .any(|q| l.contains(q.as_str()) && (l.contains("test") || l.contains("it(")))
    };
    let start = lines.iter().position(|l| defines(l))?;
    // Decorators and attributes just above belong to it (`@pytest.mark...`, `#[test]`).
    let mut first = start;
    while first > 0 {
        let t = lines[first - 1].trim_start();
        if t.starts_with('@') || t.starts_with("#[") {
            first -= 1;
        } else {
            break;
        }
    }
    let indent = indent_of(lines[start]);
    let mut end = start + 1;
    while end < lines.len() && end - first < MAX_BLOCK_LINES {
        let l = lines[end];
        if l.trim().is_empty() || indent_of(l) > indent {
            end += 1;
            continue;
        }
        let t = l.trim_start();
        if t.starts_with('}') || t.starts_with(')') {
            end += 1;
        }
        break;
    }
    Some((first, end))
}

/// The functions of the shown source files that `code` (a test named `test`) calls, in the
/// order it calls them: `(path, name, definition)`.
fn called(loc: &Localised, code: &str, test: &str) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = Vec::new();
    for name in calls_in(code) {
        if name == test || out.iter().any(|(_, n, _)| *n == name) {
            continue;
        }
        if let Some((path, def)) = loc
            .shown
            .iter()
            .filter(|f| !f.test)
            .find_map(|f| definition(&f.text, &name).map(|d| (f.path.clone(), d)))
        {
            out.push((path, name, def));
            if out.len() == MAX_CALLED {
                break;
            }
        }
    }
    out
}

/// Identifiers followed by `(` in `code`, each once, in order.
pub(super) fn calls_in(code: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < bytes.len() && ((bytes[i] as char).is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            if bytes.get(i) == Some(&b'(') {
                let w = &code[start..i];
                if !out.iter().any(|o| o == w) {
                    out.push(w.to_string());
                }
            }
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repair::localise::Shown;

    const LIB: &str = "\"\"\"Fees.\"\"\"\n\nRATE = 25\n\n\ndef days_late(due, returned):\n    \"\"\"Whole days.\"\"\"\n    return max(returned - due + 1, 0)\n\n\ndef fee(days):\n    return days * RATE\n";
    const TESTS: &str = "from lib import days_late, fee\n\n\ndef test_on_time():\n    assert days_late(10, 10) == 0\n\n\ndef test_fee():\n    assert fee(3) == 75\n";
    const OUT: &str = "$ python3 -m pytest -q\nFF\n=================================== FAILURES ===================================\n_________________________________ test_on_time _________________________________\ntest_lib.py:5: in test_on_time\n    assert days_late(10, 10) == 0\nE   assert 1 == 0\n___________________________________ test_fee ___________________________________\ntest_lib.py:9: in test_fee\n    assert fee(3) == 75\nE   assert 74 == 75\n=========================== short test summary info ============================\nFAILED test_lib.py::test_on_time - assert 1 == 0\nFAILED test_lib.py::test_fee - assert 74 == 75\n2 failed in 0.01s\n";

    fn loc() -> Localised {
        Localised {
            failing: OUT.into(),
            shown: vec![
                Shown {
                    path: "test_lib.py".into(),
                    text: TESTS.into(),
                    test: true,
                },
                Shown {
                    path: "lib.py".into(),
                    text: LIB.into(),
                    test: false,
                },
            ],
            ..Localised::default()
        }
    }

    #[test]
    fn names_are_ordered_as_the_output_has_them_and_shortened_to_what_the_source_holds() {
        let names = [
            "test_lib.py::test_fee".to_string(),
            "test_lib.py::test_on_time".to_string(),
        ];
        assert_eq!(
            in_output_order(OUT, &names),
            ["test_lib.py::test_on_time", "test_lib.py::test_fee"]
        );
        assert_eq!(short_name("t.py::TestA::test_x[1-2]"), "test_x");
        assert_eq!(short_name("tests::parses_empty"), "parses_empty");
        assert_eq!(short_name("TestParse/empty"), "TestParse");
    }

    #[test]
    fn a_pytest_section_is_cut_at_the_next_header() {
        let s = section(OUT, "test_on_time").unwrap();
        assert!(s.contains("assert 1 == 0") && !s.contains("test_fee"), "{s}");
        let s = section(OUT, "test_fee").unwrap();
        assert!(s.contains("assert 74 == 75") && !s.contains("FAILED"), "{s}");
        assert_eq!(section(OUT, "test_nothing"), None);
    }

    #[test]
    fn libtest_and_go_sections() {
        let cargo = "failures:\n\n---- tests::wraps stdout ----\nthread 'tests::wraps' panicked at src/lib.rs:9:5:\nleft: 1\n\n---- tests::other stdout ----\nboom\n\nfailures:\n    tests::wraps\n";
        let s = section(cargo, "wraps").unwrap();
        assert!(s.contains("left: 1") && !s.contains("boom"), "{s}");
        let go = "--- FAIL: TestWrap (0.00s)\n    wrap_test.go:9: got 1, want 2\n--- FAIL: TestOther (0.00s)\n    x\nFAIL\n";
        let s = section(go, "TestWrap").unwrap();
        assert!(s.contains("got 1, want 2") && !s.contains("TestOther"), "{s}");
    }

    #[test]
    fn definitions_in_python_rust_and_js() {
        assert_eq!(
            definition(LIB, "days_late").unwrap(),
            "def days_late(due, returned):\n    \"\"\"Whole days.\"\"\"\n    return max(returned - due + 1, 0)"
        );
        // Not a prefix of a longer name.
        assert_eq!(definition("def fees(x):\n    return x\n", "fee"), None);
        let rs = "#[test]\nfn wraps() {\n    assert_eq!(wrap(\"a\"), 1);\n}\n\nfn other() {}\n";
        assert_eq!(
            definition(rs, "wraps").unwrap(),
            "#[test]\nfn wraps() {\n    assert_eq!(wrap(\"a\"), 1);\n}"
        );
        let js = "test('wraps a line', () => {\n  assert.equal(wrap('a'), 1);\n});\n\ntest('x', () => {});\n";
        assert_eq!(
            definition(js, "wraps a line").unwrap(),
            "test('wraps a line', () => {\n  assert.equal(wrap('a'), 1);\n});"
        );
    }

    #[test]
    fn the_paragraph_has_the_failure_the_test_and_the_code_it_calls() {
        let p = paragraph(&loc(), "test_lib.py::test_on_time");
        assert!(p.contains("`test_lib.py::test_on_time`"), "{p}");
        assert!(p.contains("E   assert 1 == 0") && !p.contains("74 == 75"), "{p}");
        assert!(
            p.contains("def test_on_time():\n    assert days_late(10, 10) == 0"),
            "{p}"
        );
        assert!(p.contains("It calls `days_late`"), "{p}");
        assert!(p.contains("return max(returned - due + 1, 0)"), "{p}");
        // Only what this test calls.
        assert!(!p.contains("def fee("), "{p}");
    }
}
