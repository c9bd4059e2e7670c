//! A reply that gives back only the functions it changes, written into the file it came from.
//!
//! Asked about one failing test, the 1.5B local model answers with the one function it fixed
//! under the file's name (57 tokens where the whole file is 338). Taken as the whole file, that
//! fragment deleted everything else and failed; spliced in, it is the candidate it meant. It
//! is also the cheaper reply to ask for (`--repair-reply functions`): on 2 cores the model
//! writes about 7 tokens a second, so a function is seconds where the file is most of a minute.
//!
//! Read from the text only, like [`super::focus`]: a definition is a line with `def`, `class`,
//! `fn`, `func` or `function` before its name; its block runs through the lines indented
//! deeper and a closing line at its own indentation. A fragment is spliced only when that
//! cannot lose anything: each definition in it names exactly one definition of the file (or a
//! new one, put after the one before it), and every other line of it is blank, a comment, or a
//! line the file already has. Otherwise the reply is the whole file, as before.

use super::reply::FileWrite;

/// One definition of a reply: its name and its lines (decorators and comments above included).
struct Chunk<'a> {
    name: String,
    lines: Vec<&'a str>,
    /// The whitespace before its definition line.
    indent: &'a str,
    /// Its lines above the definition line (decorators, comments).
    above: usize,
}

/// Where a definition is: its name, its block's first line (decorators and comments above
/// included), the definition line, and one past its last line.
struct Span {
    name: String,
    first: usize,
    def: usize,
    end: usize,
}

/// `fragment` written into `original` definition by definition, with the names it replaced
/// (then those it added), or `None` when it cannot be read as such a fragment.
pub fn splice(original: &str, fragment: &str) -> Option<(String, Vec<String>)> {
    let frag: Vec<&str> = fragment.lines().collect();
    let frag_spans = spans(&frag);
    // The fragment's own level: the least indented of its definitions. Deeper ones are inside.
    let level = frag_spans.iter().map(|s| indent(frag[s.def]).len()).min()?;
    let top: Vec<&Span> = frag_spans
        .iter()
        .filter(|s| indent(frag[s.def]).len() == level)
        .collect();
    let orig: Vec<&str> = original.lines().collect();
    let orig_lines: std::collections::HashSet<&str> = orig.iter().map(|l| l.trim()).collect();
    // Every line outside the definitions must be one the file has (an import, the module's
    // docstring), blank, or a comment (`# ... rest unchanged`): nothing else can be lost.
    let mut inside = vec![false; frag.len()];
    for s in &top {
        inside[s.first..s.end].iter_mut().for_each(|x| *x = true);
    }
    let outside_ok = frag.iter().zip(&inside).all(|(l, inside)| {
        let t = l.trim();
        *inside || t.is_empty() || t.starts_with('#') || t.starts_with("//") || orig_lines.contains(t)
    });
    if !outside_ok {
        return None;
    }
    let chunks: Vec<Chunk> = top
        .iter()
        .map(|s| Chunk {
            name: s.name.clone(),
            lines: trim_blank_end(&frag[s.first..s.end]).to_vec(),
            indent: indent(frag[s.def]),
            above: s.def - s.first,
        })
        .collect();
    let orig_spans = spans(&orig);
    // Each of the fragment's definitions: the one span of the file with its name, if any.
    let mut targets: Vec<Option<&Span>> = Vec::new();
    for c in &chunks {
        let same: Vec<&Span> = orig_spans.iter().filter(|s| s.name == c.name).collect();
        match same.as_slice() {
            [] => targets.push(None),
            [one] => targets.push(Some(one)),
            // Two definitions of that name (methods of two classes): which one is meant is a guess.
            _ => return None,
        }
    }
    if targets.iter().all(Option::is_none) {
        return None;
    }
    // Replacements, by the file's line ranges; a new definition goes after the one before it
    // in the fragment (or before the first replaced one).
    let mut edits: Vec<(usize, usize, Vec<String>)> = Vec::new();
    let mut replaced = Vec::new();
    let mut added = Vec::new();
    let mut anchor: Option<(usize, &str)> = None;
    let mut pending: Vec<&Chunk> = Vec::new();
    for (c, t) in chunks.iter().zip(&targets) {
        match t {
            Some(span) => {
                let to = indent(orig[span.def]);
                let mut lines = Vec::new();
                for p in pending.drain(..) {
                    lines.extend(reindent(&p.lines, p.indent, to));
                    lines.push(String::new());
                    if to.is_empty() {
                        lines.push(String::new());
                    }
                }
                lines.extend(reindent(&c.lines, c.indent, to));
                // The file's decorators and comments above stay unless the fragment has its own.
                let start = span.first.max(span.def.saturating_sub(c.above));
                let end = span.def + trim_blank_end(&orig[span.def..span.end]).len();
                if edits.iter().any(|(a, b, _)| start < *b && *a < end) {
                    return None;
                }
                edits.push((start, end, lines));
                replaced.push(c.name.clone());
                anchor = Some((end, to));
            }
            None => match anchor {
                Some((at, to)) => {
                    let mut lines = vec![String::new()];
                    if to.is_empty() {
                        lines.push(String::new());
                    }
                    lines.extend(reindent(&c.lines, c.indent, to));
                    edits.push((at, at, lines));
                    added.push(c.name.clone());
                }
                None => {
                    pending.push(c);
                    added.push(c.name.clone());
                }
            },
        }
    }
    edits.sort_by_key(|(a, b, _)| (*a, *b));
    let mut out: Vec<String> = Vec::new();
    let mut at = 0;
    for (a, b, lines) in edits {
        out.extend(orig[at..a].iter().map(|l| l.to_string()));
        out.extend(lines);
        at = b;
    }
    out.extend(orig[at..].iter().map(|l| l.to_string()));
    let mut text = out.join("\n");
    if original.ends_with('\n') || original.is_empty() {
        text.push('\n');
    }
    replaced.extend(added);
    Some((text, replaced))
}

/// A reply's writes in order (a file may come more than once, a function at a time), each
/// spliced into the file as the writes before it left it when it is a fragment of it
/// ([`splice`]); with a note for each splice.
pub fn apply(
    writes: Vec<FileWrite>,
    text_of: &dyn Fn(&str) -> Option<String>,
) -> (Vec<FileWrite>, Vec<String>) {
    let mut files: Vec<FileWrite> = Vec::new();
    let mut notes = Vec::new();
    for w in writes {
        let current = files
            .iter()
            .find(|f| f.path == w.path)
            .map(|f| f.content.clone())
            .or_else(|| text_of(&w.path));
        let content = match current.as_deref().and_then(|c| splice(c, &w.content)) {
            Some((text, names)) => {
                let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
                notes.push(format!("{}: {} written into the file", w.path, names.join(", ")));
                text
            }
            None => w.content,
        };
        match files.iter_mut().find(|f| f.path == w.path) {
            Some(f) => f.content = content,
            None => files.push(FileWrite {
                path: w.path,
                content,
            }),
        }
    }
    (files, notes)
}

fn indent(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

fn trim_blank_end<'a, 'b>(lines: &'b [&'a str]) -> &'b [&'a str] {
    let n = lines
        .iter()
        .rposition(|l| !l.trim().is_empty())
        .map_or(0, |i| i + 1);
    &lines[..n]
}

/// `lines`, written at the indentation `from` had, moved to `to`.
fn reindent(lines: &[&str], from: &str, to: &str) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            if l.trim().is_empty() {
                String::new()
            } else if let Some(rest) = l.strip_prefix(from) {
                format!("{to}{rest}")
            } else {
                format!("{to}{}", l.trim_start())
            }
        })
        .collect()
}

/// The name a definition line defines: `def name(`, `async def name(`, `class Name`,
/// `pub fn name(`, `fn name<`, `func name(`, `func (r *T) name(`, `export function name(`.
fn defines(line: &str) -> Option<String> {
    const QUALIFIERS: [&str; 10] = [
        "pub(crate)",
        "pub(super)",
        "pub",
        "async",
        "export",
        "default",
        "unsafe",
        "const",
        "static",
        "extern",
    ];
    let rest = crate::project::defs::without_qualifiers(line, &QUALIFIERS);
    for k in ["def", "class", "fn", "func", "function"] {
        let Some(mut r) = rest.strip_prefix(k) else {
            continue;
        };
        if !(r.starts_with(char::is_whitespace) || k == "func" && r.starts_with('(')) {
            continue;
        }
        r = r.trim_start();
        // A Go method: the receiver first.
        if k == "func" && r.starts_with('(') {
            r = r[r.find(')')? + 1..].trim_start();
        }
        let name: String = r
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
            .collect();
        let after = r[name.len()..].trim_start();
        let opens = after.starts_with('(')
            || after.starts_with('<')
            || (k == "class" && (after.starts_with(':') || after.starts_with('{')));
        if !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()) && opens {
            return Some(name);
        }
    }
    None
}

/// The definitions of `lines`, outermost first where one holds another.
fn spans(lines: &[&str]) -> Vec<Span> {
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(name) = defines(l) else { continue };
        let level = indent(l).len();
        // Decorators, attributes and comments just above, at its own indentation.
        let mut first = i;
        while first > 0 {
            let above = lines[first - 1];
            let t = above.trim_start();
            let part = indent(above).len() == level
                && (t.starts_with('@') || t.starts_with("#[") || t.starts_with("//") || t.starts_with('#'));
            if part && defines(above).is_none() {
                first -= 1;
            } else {
                break;
            }
        }
        out.push(Span {
            name,
            first,
            def: i,
            end: block_end(lines, i),
        });
    }
    out
}

/// One past the last line of the block that starts at `start`: the lines indented deeper (and
/// blank ones), then a closing line at its own indentation (`}`, `});`) unless it opens the
/// body (`) -> u32 {` of a signature over several lines).
fn block_end(lines: &[&str], start: usize) -> usize {
    let level = indent(lines[start]).len();
    let mut i = start + 1;
    while i < lines.len() {
        let l = lines[i];
        if l.trim().is_empty() || indent(l).len() > level {
            i += 1;
            continue;
        }
        let t = l.trim();
        if t.starts_with(['}', ')', ']']) {
            if t.ends_with('{') || t.ends_with(':') {
                i += 1;
                continue;
            }
            return i + 1;
        }
        break;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: &str = "\"\"\"Fees.\"\"\"\n\nimport math\n\n\ndef days_late(due, returned):\n    return max(returned - due + 1, 0)\n\n\n@cached\ndef late_fee(days, member):\n    fee = days * 25\n    if member:\n        fee = fee / 2\n    return fee\n\n\nclass Shelf:\n    def count(self):\n        return 0\n";

    #[test]
    fn one_function_replaces_its_definition_and_nothing_else() {
        let fix = "def days_late(due, returned):\n    return max(returned - due, 0)\n";
        let (text, names) = splice(LIB, fix).unwrap();
        assert_eq!(names, ["days_late"]);
        assert_eq!(text, LIB.replace("returned - due + 1", "returned - due"));
    }

    #[test]
    fn imports_the_file_has_and_comments_around_it_are_not_lost_or_added() {
        let fix = "import math\n\n# ... the rest is unchanged\n\n@cached\ndef late_fee(days, member):\n    fee = days * 25\n    if member:\n        fee = fee // 2\n    return fee\n";
        let (text, _) = splice(LIB, fix).unwrap();
        assert_eq!(text, LIB.replace("fee / 2", "fee // 2"));
    }

    #[test]
    fn a_method_alone_goes_back_into_its_class_at_its_indentation() {
        let fix = "def count(self):\n    return 1\n";
        let (text, _) = splice(LIB, fix).unwrap();
        assert_eq!(text, LIB.replace("return 0", "return 1"));
    }

    #[test]
    fn a_new_helper_goes_after_the_function_before_it() {
        let fix = "def days_late(due, returned):\n    return clamp(returned - due)\n\ndef clamp(n):\n    return max(n, 0)\n";
        let (text, names) = splice(LIB, fix).unwrap();
        assert_eq!(names, ["days_late", "clamp"]);
        assert!(
            text.contains(
                "    return clamp(returned - due)\n\n\ndef clamp(n):\n    return max(n, 0)\n\n\n@cached"
            ),
            "{text}"
        );
    }

    #[test]
    fn decorators_and_comments_above_stay_when_the_fragment_has_none() {
        let fix = "def late_fee(days, member):\n    return 0\n";
        let (text, _) = splice(LIB, fix).unwrap();
        assert!(
            text.contains("\n@cached\ndef late_fee(days, member):\n    return 0\n\n\nclass"),
            "{text}"
        );
    }

    #[test]
    fn lines_the_file_lacks_outside_a_definition_make_it_the_whole_file() {
        assert!(splice(LIB, "RATE = 3\n\ndef days_late(d, r):\n    return 0\n").is_none());
        // No definition of the file at all: a whole file (or junk), not a fragment.
        assert!(splice(LIB, "def other():\n    return 1\n").is_none());
        assert!(splice(LIB, "fee = 37\n").is_none());
    }

    #[test]
    fn a_name_defined_twice_in_the_file_is_not_guessed() {
        let two = "class A:\n    def size(self):\n        return 1\n\nclass B:\n    def size(self):\n        return 2\n";
        assert!(splice(two, "def size(self):\n    return 3\n").is_none());
        // The class around it says which.
        let (text, _) = splice(two, "class B:\n    def size(self):\n        return 3\n").unwrap();
        assert_eq!(text, two.replace("return 2", "return 3"));
    }

    #[test]
    fn the_whole_file_given_back_changed_is_that_file() {
        let whole = LIB.replace("fee / 2", "fee // 2");
        let (text, _) = splice(LIB, &whole).unwrap();
        assert_eq!(text, whole);
    }

    #[test]
    fn brace_languages_rust_go_and_javascript() {
        let rs = "use std::fmt;\n\n/// Doubles.\npub fn double(x: u32) -> u32 {\n    x * 3\n}\n\nfn long(\n    a: u32,\n) -> u32 {\n    a\n}\n\n#[cfg(test)]\nmod tests {}\n";
        let (text, _) = splice(rs, "/// Doubles.\npub fn double(x: u32) -> u32 {\n    x * 2\n}\n").unwrap();
        assert_eq!(text, rs.replace("x * 3", "x * 2"));
        let (text, _) = splice(rs, "fn long(\n    a: u32,\n) -> u32 {\n    a + 1\n}\n").unwrap();
        assert_eq!(text, rs.replace("    a\n}", "    a + 1\n}"));
        let go = "package roman\n\nfunc (r *R) Add(n int) int {\n\treturn n\n}\n\nfunc Two() int {\n\treturn 2\n}\n";
        let (text, _) = splice(go, "func (r *R) Add(n int) int {\n\treturn n + 1\n}\n").unwrap();
        assert_eq!(text, go.replace("return n\n", "return n + 1\n"));
        let js =
            "\"use strict\";\n\nfunction slugify(t) {\n  return t;\n}\n\nmodule.exports = { slugify };\n";
        let (text, _) = splice(js, "function slugify(t) {\n  return t.trim();\n}\n").unwrap();
        assert_eq!(text, js.replace("return t;", "return t.trim();"));
    }

    #[test]
    fn several_writes_of_one_file_are_spliced_one_after_another() {
        let writes = vec![
            FileWrite {
                path: "lib.py".into(),
                content: "def days_late(due, returned):\n    return max(returned - due, 0)\n".into(),
            },
            FileWrite {
                path: "lib.py".into(),
                content: "@cached\ndef late_fee(days, member):\n    fee = days * 25\n    if member:\n        fee = fee // 2\n    return fee\n".into(),
            },
        ];
        let (files, notes) = apply(writes, &|p| (p == "lib.py").then(|| LIB.to_string()));
        assert_eq!(files.len(), 1);
        assert_eq!(
            files[0].content,
            LIB.replace("returned - due + 1", "returned - due")
                .replace("fee / 2", "fee // 2")
        );
        assert_eq!(notes.len(), 2, "{notes:?}");
    }
}
