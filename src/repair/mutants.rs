//! Candidates without the model (`--repair-mutants N`): one small change at a time to the
//! functions the failing tests call, each judged like a model's candidate.
//!
//! Why: many real bugs are one token away from the fix (an off-by-one, `/` for `//`, `<` for
//! `<=`), which is what mutation testing and template-based program repair build on. A 1.5B
//! model given such a bug at temperature 0 mostly gives the function back unchanged (the
//! demo's `days_late`, measured on every run of the last two rounds), and on 2 cores each of its
//! candidates costs 20-60 s, where a mutant costs one test run. Rounds make two independent
//! one-token bugs reachable: a mutant that fixes some failing tests and breaks none is kept, and
//! the next round mutates from it.
//!
//! Read from the text only, like `focus`: the functions are found by their names, strings and
//! comments are masked so that nothing inside them changes. Only languages whose literals and
//! comments are masked here get mutants (Python, JavaScript/TypeScript, Rust, Go, and other
//! C-like files); a change the language does not allow just fails its test run.

use super::focus;
use super::localise::Localised;

/// Functions mutated at most per round: those the failing tests call, then what those call.
const MAX_FUNCTIONS: usize = 8;

/// One small change to one source file.
#[derive(Debug, Clone, PartialEq)]
pub struct Mutant {
    pub path: String,
    /// The whole file with the change.
    pub content: String,
    /// What changed and where: "`+ 1` dropped, library.py:11".
    pub what: String,
    /// A change of a line or a block, not of one token: tried only when no one-token change
    /// of the round made progress.
    pub structural: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Lang {
    Python,
    /// `//` and `/* */` comments; `'` quotes a string except in Rust (lifetimes).
    CLike {
        single_quote: bool,
    },
}

fn lang(path: &str) -> Option<Lang> {
    let ext = path.rsplit_once('.').map(|(_, e)| e)?;
    match ext {
        "py" => Some(Lang::Python),
        "rs" => Some(Lang::CLike { single_quote: false }),
        "js" | "mjs" | "cjs" | "jsx" | "ts" | "tsx" | "go" | "java" | "c" | "h" | "cc" | "cpp" | "cs"
        | "kt" | "swift" => Some(Lang::CLike { single_quote: true }),
        _ => None,
    }
}

/// For each byte of `text`: whether it is code, not part of a string literal or a comment.
fn code_mask(text: &str, lang: Lang) -> Vec<bool> {
    #[derive(Clone, Copy, PartialEq)]
    enum S {
        Code,
        LineComment,
        BlockComment,
        Str { quote: u8, triple: bool },
    }
    let b = text.as_bytes();
    let mut mask = vec![false; b.len()];
    let mut s = S::Code;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match s {
            S::Code => {
                let python = lang == Lang::Python;
                if (python && c == b'#') || (!python && c == b'/' && b.get(i + 1) == Some(&b'/')) {
                    s = S::LineComment;
                } else if !python && c == b'/' && b.get(i + 1) == Some(&b'*') {
                    s = S::BlockComment;
                    i += 2;
                    continue;
                } else if c == b'"'
                    || c == b'`' && !python
                    || c == b'\'' && (python || lang == (Lang::CLike { single_quote: true }))
                {
                    let triple = python && b.get(i + 1) == Some(&c) && b.get(i + 2) == Some(&c);
                    s = S::Str { quote: c, triple };
                    i += if triple { 3 } else { 1 };
                    continue;
                } else {
                    mask[i] = true;
                }
                i += 1;
            }
            S::LineComment => {
                if c == b'\n' {
                    s = S::Code;
                    mask[i] = true;
                }
                i += 1;
            }
            S::BlockComment => {
                if c == b'*' && b.get(i + 1) == Some(&b'/') {
                    s = S::Code;
                    i += 2;
                } else {
                    i += 1;
                }
            }
            S::Str { quote, triple } => {
                if c == b'\\' {
                    i += 2;
                } else if c == quote && (!triple || (b.get(i + 1) == Some(&c) && b.get(i + 2) == Some(&c))) {
                    s = S::Code;
                    i += if triple { 3 } else { 1 };
                } else if c == b'\n' && !triple && quote != b'`' {
                    // An unclosed one-line string (or a quote this mask misread): it ends at the
                    // line's end, so one misreading cannot hide the rest of the file.
                    s = S::Code;
                    mask[i] = true;
                    i += 1;
                } else {
                    i += 1;
                }
            }
        }
    }
    mask
}

/// An edit of one line: bytes `start..end` become `with`; `what` says it in words.
struct Edit {
    start: usize,
    end: usize,
    with: String,
    what: String,
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The one-token changes of `line` (`code`: its bytes' mask), in the order they appear.
fn edits(line: &str, code: &[bool], lang: Lang) -> Vec<Edit> {
    let b = line.as_bytes();
    let at = |i: usize| b.get(i).copied().unwrap_or(b'\n');
    let is_code = |i: usize, n: usize| (i..i + n).all(|k| code.get(k).copied().unwrap_or(false));
    let spaced = |i: usize, n: usize| i > 0 && at(i - 1) == b' ' && at(i + n) == b' ';
    let mut out = Vec::new();
    let mut edit = |start: usize, end: usize, with: &str, what: String| {
        out.push(Edit {
            start,
            end,
            with: with.to_string(),
            what,
        })
    };
    let mut i = 0;
    while i < b.len() {
        if !is_code(i, 1) {
            i += 1;
            continue;
        }
        let c = at(i);
        let two = &b[i..(i + 2).min(b.len())];
        // Python's division: true and floor.
        if lang == Lang::Python && c == b'/' {
            if at(i + 1) == b'/' && at(i + 2) != b'=' && is_code(i, 2) {
                edit(i, i + 2, "/", "`//` → `/`".into());
                i += 2;
                continue;
            }
            if at(i + 1) == b'/' {
                // `//=`: an assignment, left.
                i += 2;
                continue;
            }
            if at(i + 1) != b'=' {
                edit(i, i + 1, "//", "`/` → `//`".into());
            }
        }
        // Comparisons: a boundary moved, or turned round.
        if (two == b"<=" || two == b">=") && spaced(i, 2) && is_code(i, 2) {
            let (with, from) = if c == b'<' { ("<", "<=") } else { (">", ">=") };
            edit(i, i + 2, with, format!("`{from}` → `{with}`"));
            i += 2;
            continue;
        }
        if (c == b'<' || c == b'>') && spaced(i, 1) {
            let (with, from) = if c == b'<' { ("<=", "<") } else { (">=", ">") };
            edit(i, i + 1, with, format!("`{from}` → `{with}`"));
        }
        if (two == b"==" || two == b"!=") && spaced(i, 2) && is_code(i, 2) {
            let (with, from) = if c == b'=' { ("!=", "==") } else { ("==", "!=") };
            edit(i, i + 2, with, format!("`{from}` → `{with}`"));
            i += 2;
            continue;
        }
        // Binary `+` and `-`: `± 1` dropped or turned round, any other term turned round.
        if (c == b'+' || c == b'-') && spaced(i, 1) {
            let mut j = i + 1;
            while at(j) == b' ' {
                j += 1;
            }
            let one = at(j) == b'1' && !(is_word(at(j + 1)) || at(j + 1) == b'.') && is_code(j, 1);
            let sign = c as char;
            let other = if c == b'+' { "-" } else { "+" };
            if one {
                let mut k = i;
                while k > 0 && at(k - 1) == b' ' {
                    k -= 1;
                }
                edit(k, j + 1, "", format!("`{sign} 1` dropped"));
                edit(i, i + 1, other, format!("`{sign} 1` → `{other} 1`"));
            } else {
                edit(i, i + 1, other, format!("`{sign}` → `{other}`"));
            }
        }
        // Words: the smaller for the larger, `and` for `or`.
        if is_word(c) && (i == 0 || !is_word(at(i - 1))) {
            let mut j = i;
            while is_word(at(j)) {
                j += 1;
            }
            let word = &line[i..j];
            let swap = match (word, lang) {
                ("min", _) if at(j) == b'(' => Some("max"),
                ("max", _) if at(j) == b'(' => Some("min"),
                ("and", Lang::Python) => Some("or"),
                ("or", Lang::Python) => Some("and"),
                _ => None,
            };
            if let Some(with) = swap
                && is_code(i, j - i)
            {
                edit(i, j, with, format!("`{word}` → `{with}`"));
            }
            i = j;
            continue;
        }
        if lang != Lang::Python && (two == b"&&" || two == b"||") && is_code(i, 2) {
            let (with, from) = if c == b'&' { ("||", "&&") } else { ("&&", "||") };
            edit(i, i + 2, with, format!("`{from}` → `{with}`"));
            i += 2;
            continue;
        }
        i += 1;
    }
    for (start, end, with, what) in precedence(line, code, lang)
        .into_iter()
        .chain(range_ends(line, code, lang))
    {
        edit(start, end, &with, what);
    }
    out
}

/// Where the bracket opened at `open` closes on this line (code only), if it does.
fn closing(b: &[u8], code: &[bool], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (k, &c) in b.iter().enumerate().skip(open) {
        if !code.get(k).copied().unwrap_or(false) {
            continue;
        }
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// Where the bracket closed at `close` opened on this line (code only), if it does.
fn opening(b: &[u8], code: &[bool], close: usize) -> Option<usize> {
    let mut depth = 0usize;
    for k in (0..=close).rev() {
        if !code.get(k).copied().unwrap_or(false) {
            continue;
        }
        match b[k] {
            b')' | b']' | b'}' => depth += 1,
            b'(' | b'[' | b'{' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// The operand that starts at `i` (a name or number with its `.field`s, calls and indexes, or
/// a bracketed expression): its end.
fn operand_after(b: &[u8], code: &[bool], i: usize) -> Option<usize> {
    let mut j = i;
    loop {
        match b.get(j) {
            Some(b'(' | b'[') => j = closing(b, code, j)? + 1,
            Some(&c) if is_word(c) || c == b'.' => j += 1,
            _ => break,
        }
    }
    (j > i && code.get(i).copied().unwrap_or(false)).then_some(j)
}

/// The operand that ends just before `end`: its start.
fn operand_before(b: &[u8], code: &[bool], end: usize) -> Option<usize> {
    let mut i = end;
    while i > 0 {
        match b[i - 1] {
            b')' | b']' => i = opening(b, code, i - 1)?,
            c if is_word(c) || c == b'.' => i -= 1,
            _ => break,
        }
    }
    (i < end && code.get(i).copied().unwrap_or(false)).then_some(i)
}

/// A precedence mistake put right by brackets: `a - b * c` → `(a - b) * c` (also `+`, `/`),
/// and in Python `x and y or z` → `x and (y or z)`.
fn precedence(line: &str, code: &[bool], lang: Lang) -> Vec<(usize, usize, String, String)> {
    let b = line.as_bytes();
    let at = |i: usize| b.get(i).copied().unwrap_or(b'\n');
    let is_code = |i: usize| code.get(i).copied().unwrap_or(false);
    let mut out = Vec::new();
    for i in 1..b.len() {
        let c = b[i];
        if !((c == b'+' || c == b'-') && is_code(i) && at(i - 1) == b' ' && at(i + 1) == b' ') {
            continue;
        }
        let (Some(start), Some(end)) = (operand_before(b, code, i - 1), operand_after(b, code, i + 2)) else {
            continue;
        };
        let next = at(end + 1);
        if at(end) == b' ' && (next == b'*' || next == b'/') && is_code(end + 1) && at(end + 2) != b'=' {
            let op = &line[i..i + 1];
            let times = if next == b'*' { "*" } else { "/" };
            out.push((
                start,
                end,
                format!("({})", &line[start..end]),
                format!("`a {op} b {times} c` → `(a {op} b) {times} c`"),
            ));
        }
    }
    if lang == Lang::Python
        && let (Some(and), Some(or)) = (line.find(" and "), line.rfind(" or "))
        && and < or
        && is_code(and + 1)
        && is_code(or + 1)
    {
        let start = and + " and ".len();
        let mut end = line.trim_end().len();
        if line[..end].ends_with(':') {
            end -= 1;
        }
        let span = &line[start..end];
        let balanced = span.bytes().enumerate().try_fold(0i32, |depth, (k, c)| {
            let depth = match c {
                b'(' | b'[' | b'{' if is_code(start + k) => depth + 1,
                b')' | b']' | b'}' if is_code(start + k) => depth - 1,
                _ => depth,
            };
            (depth >= 0).then_some(depth)
        }) == Some(0);
        if balanced && !span.trim_start().starts_with('(') {
            out.push((
                start,
                end,
                format!("({span})"),
                "`x and y or z` → `x and (y or z)`".into(),
            ));
        }
    }
    out
}

/// Python's `range(...)` one further: `range(n - k)` → `range(n - k + 1)` (an off-by-one in a
/// loop's bound, where no `+ 1` was written to drop).
fn range_ends(line: &str, code: &[bool], lang: Lang) -> Vec<(usize, usize, String, String)> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    if lang != Lang::Python {
        return out;
    }
    let mut from = 0;
    while let Some(k) = line[from..].find("range(").map(|k| k + from) {
        from = k + "range(".len();
        let word_before = k > 0 && is_word(b[k - 1]);
        if word_before || !code.get(k).copied().unwrap_or(false) {
            continue;
        }
        let open = k + "range".len();
        let Some(close) = closing(b, code, open) else {
            continue;
        };
        let last = line[open + 1..close].rsplit(',').next().unwrap_or("").trim();
        if last.is_empty() || last.ends_with("+ 1") || last.ends_with("- 1") {
            continue;
        }
        out.push((close, close, " + 1".into(), "`+ 1` added to range()'s end".into()));
    }
    out
}

/// The functions of the shown sources that the failing `tests` call, then the functions those
/// call, in that order: `(path, name)`.
fn targets(loc: &Localised, tests: &[String]) -> Vec<(String, String)> {
    let find = |name: &str, test: bool| {
        loc.shown
            .iter()
            .filter(|f| f.test == test)
            .find_map(|f| focus::definition(&f.text, name).map(|d| (f.path.clone(), d)))
    };
    let mut out: Vec<(String, String, String)> = Vec::new();
    let add = |path: String, name: String, def: String, out: &mut Vec<(String, String, String)>| {
        if out.len() < MAX_FUNCTIONS && !out.iter().any(|(p, n, _)| *p == path && *n == name) {
            out.push((path, name, def));
        }
    };
    for test in tests {
        let short = focus::short_name(test);
        // A test in a test file, else beside the code (Rust's `mod tests`).
        let Some((_, code)) = find(short, true).or_else(|| find(short, false)) else {
            continue;
        };
        for name in focus::calls_in(&code) {
            if name != short
                && let Some((path, def)) = find(&name, false)
            {
                add(path, name, def, &mut out);
            }
        }
    }
    let direct = out.len();
    for k in 0..direct {
        let (_, own, def) = out[k].clone();
        for name in focus::calls_in(&def) {
            if name != own
                && let Some((path, def)) = find(&name, false)
            {
                add(path, name, def, &mut out);
            }
        }
    }
    out.into_iter().map(|(p, n, _)| (p, n)).collect()
}

/// Up to `max` mutants of the functions the failing `tests` call, in the files as `loc` shows
/// them: each function's lines in order, the first test's functions first; never a test file,
/// never the same file twice.
pub fn mutants(loc: &Localised, tests: &[String], max: usize) -> Vec<Mutant> {
    let mut out: Vec<Mutant> = Vec::new();
    if max == 0 {
        return out;
    }
    let targets = targets(loc, tests);
    one_token(loc, &targets, max, &mut out);
    // Then changes of a line or a block, function by function: fewer of them are fixes, and
    // each costs a test run, so they come after every one-token change.
    for (path, name) in &targets {
        if out.len() >= max {
            break;
        }
        let (Some(lang), Some(file)) = (lang(path), loc.shown.iter().find(|f| f.path == *path && !f.test))
        else {
            continue;
        };
        for (content, what) in structural(&file.text, name, lang) {
            if out.len() >= max {
                break;
            }
            if !out.iter().any(|m| m.path == *path && m.content == content) {
                out.push(Mutant {
                    path: path.clone(),
                    content,
                    what: format!("{what}, {path}"),
                    structural: true,
                });
            }
        }
    }
    out
}

/// The one-token mutants of the functions `targets`, in order, until `out` holds `max`.
fn one_token(loc: &Localised, targets: &[(String, String)], max: usize, out: &mut Vec<Mutant>) {
    for (path, name) in targets.iter().cloned() {
        let (Some(lang), Some(file)) = (lang(&path), loc.shown.iter().find(|f| f.path == path && !f.test))
        else {
            continue;
        };
        let text = &file.text;
        let lines: Vec<&str> = text.split('\n').collect();
        let Some((first, end)) = focus::definition_lines(&lines, &name) else {
            continue;
        };
        let mask = code_mask(text, lang);
        let mut offset: usize = lines[..first].iter().map(|l| l.len() + 1).sum();
        let mut signature_seen = false;
        for (n, line) in lines.iter().enumerate().take(end).skip(first) {
            let starts = offset;
            offset += line.len() + 1;
            // Decorators and the signature's line are left: a default argument is rarely the
            // bug, and a changed name would only break the callers.
            if !signature_seen {
                let t = line.trim_start();
                signature_seen = !(t.starts_with('@') || t.starts_with("#["));
                continue;
            }
            let code = &mask[starts..starts + line.len()];
            for e in edits(line, code, lang) {
                let content = format!(
                    "{}{}{}",
                    &text[..starts + e.start],
                    &e.with,
                    &text[starts + e.end..]
                );
                if out.iter().any(|m| m.path == path && m.content == content) {
                    continue;
                }
                out.push(Mutant {
                    path: path.clone(),
                    content,
                    what: format!("{}, {path}:{}", e.what, n + 1),
                    structural: false,
                });
                if out.len() >= max {
                    return;
                }
            }
        }
    }
}

/// The changes of a line or a block to the function `name` of `text`, each as the whole file
/// and words for it: the classic statement deletion of mutation testing (a line that has a
/// sibling, so that no block is left empty; an `else` branch), and two Python bugs that no
/// one-token change reaches: a mutable default argument (`tracks=[]`, shared by every call)
/// and a parameter aliased before it is changed (`result = samples`, then `result[i] = ...`).
fn structural(text: &str, name: &str, lang: Lang) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.split('\n').collect();
    let Some((first, end)) = focus::definition_lines(&lines, name) else {
        return Vec::new();
    };
    let Some(sig) = (first..end).find(|&i| {
        let t = lines[i].trim_start();
        !(t.starts_with('@') || t.starts_with("#["))
    }) else {
        return Vec::new();
    };
    let indent = |l: &str| l.len() - l.trim_start().len();
    let blank = |l: &str| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#') || t.starts_with("//")
    };
    let with = |from: usize, to: usize, new: &[String]| -> String {
        let mut out: Vec<String> = lines[..from].iter().map(|l| l.to_string()).collect();
        out.extend(new.iter().cloned());
        out.extend(lines[to..].iter().map(|l| l.to_string()));
        out.join("\n")
    };
    let mut out = Vec::new();
    let python = lang == Lang::Python;
    // Where deletion starts: after the signature, and after a Python docstring.
    let mut statements = sig + 1;
    let mut params: Vec<String> = Vec::new();
    if python {
        let body_indent = lines[sig + 1..end]
            .iter()
            .find(|l| !blank(l))
            .map_or(4, |l| indent(l));
        // After the docstring, if the body starts with one.
        let mut body = sig + 1;
        while body < end && lines[body].trim().is_empty() {
            body += 1;
        }
        if body < end {
            let t = lines[body].trim_start();
            for q in ["\"\"\"", "'''"] {
                if let Some(rest) = t.strip_prefix(q) {
                    body = if rest.contains(q) {
                        body + 1
                    } else {
                        (body + 1..end)
                            .find(|&i| lines[i].contains(q))
                            .map_or(end, |i| i + 1)
                    };
                }
            }
        }
        statements = body;
        let pad = " ".repeat(body_indent);
        let signature = lines[sig];
        if signature.trim_end().ends_with(':') {
            for (empty, ctor) in [("[]", "[]"), ("{}", "{}"), ("set()", "set()")] {
                let mut from = 0;
                while let Some(at) = signature[from..].find(&format!("={empty}")) {
                    let at = from + at;
                    from = at + 1;
                    let param: String = signature[..at]
                        .trim_end()
                        .chars()
                        .rev()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    if param.is_empty() {
                        continue;
                    }
                    let mut new = vec![format!(
                        "{}=None{}",
                        &signature[..at],
                        &signature[at + 1 + empty.len()..]
                    )];
                    new.extend(lines[sig + 1..body].iter().map(|l| l.to_string()));
                    new.push(format!("{pad}if {param} is None:"));
                    new.push(format!("{pad}    {param} = {ctor}"));
                    out.push((
                        with(sig, body, &new),
                        format!("`{param}={empty}` → `{param}=None`, a new one each call"),
                    ));
                }
            }
        }
        params = signature
            .split_once('(')
            .and_then(|(_, r)| r.rsplit_once(')'))
            .map(|(ps, _)| {
                ps.split(',')
                    .map(|p| {
                        p.trim()
                            .trim_start_matches('*')
                            .split([':', '='])
                            .next()
                            .unwrap_or("")
                            .trim()
                            .to_string()
                    })
                    .filter(|p| !p.is_empty() && p != "self" && p != "cls")
                    .collect()
            })
            .unwrap_or_default();
        for (i, l) in lines.iter().enumerate().take(end).skip(body) {
            let t = l.trim();
            if let Some((target, value)) = t.split_once(" = ")
                && params.iter().any(|p| p == value.trim())
                && target.chars().all(|c| c.is_alphanumeric() || c == '_')
            {
                let new = [format!("{}{target} = {}.copy()", &l[..indent(l)], value.trim())];
                out.push((with(i, i + 1, &new), format!("`{t}` → a copy, line {}", i + 1)));
            }
        }
    }
    // Statement deletion.
    for i in statements..end {
        let l = lines[i];
        if blank(l) || l.trim_start().starts_with(['"', '\'']) {
            continue;
        }
        let t = l.trim();
        let level = indent(l);
        // The lines of its block: deeper ones after it.
        let block_end = (i + 1..end)
            .find(|&k| !lines[k].trim().is_empty() && indent(lines[k]) <= level)
            .unwrap_or(end);
        if python && (t == "else:" || t.starts_with("else:")) {
            out.push((
                with(i, block_end, &[]),
                format!("`else` branch deleted, line {}", i + 1),
            ));
            continue;
        }
        if !python && t == "} else {" {
            if let Some(close) =
                (i + 1..end).find(|&k| indent(lines[k]) == level && lines[k].trim().starts_with('}'))
            {
                let new = [format!("{}}}", &l[..level])];
                out.push((
                    with(i, close + 1, &new),
                    format!("`else` branch deleted, line {}", i + 1),
                ));
            }
            continue;
        }
        let opens = t.ends_with(':') || t.ends_with('{') || t.ends_with('(') || t.ends_with('[');
        let closes = t.starts_with(['}', ')', ']']);
        let continued = t.ends_with(',')
            || t.ends_with('\\')
            || t.ends_with('+')
            || t.ends_with("&&")
            || t.ends_with("||");
        // A declaration or a `return` deleted fails to compile in Go and Rust (and a Python
        // function without its `return` returns None): each would cost a test run for nothing
        // (25 s for a Go candidate here).
        let declares = ["let ", "var ", "const ", "return"]
            .iter()
            .any(|k| t.starts_with(k))
            || t.contains(":=");
        // In Python, a name's first assignment: deleted, its later use is a NameError.
        let first_assignment = python
            && t.split_once(" = ").is_some_and(|(name, _)| {
                name.chars().all(|c| c.is_alphanumeric() || c == '_')
                    && !params.iter().any(|p| p == name)
                    && !lines[statements..i].iter().any(|l| {
                        let l = l.trim_start();
                        l.starts_with(&format!("{name} ")) || l.starts_with(&format!("for {name} "))
                    })
            });
        if opens || closes || continued || declares || first_assignment || block_end != i + 1 {
            continue;
        }
        // A sibling at its level, so that its block is not left empty.
        // (A closing line at its level just before it ends a sibling: `if (..) { .. }`.)
        let at_level = |k: usize| !blank(lines[k]) && indent(lines[k]) == level;
        let before = (sig + 1..i).rev().find(|&k| !blank(lines[k]));
        let after = (i + 1..end).find(|&k| !blank(lines[k]));
        if before.is_some_and(at_level)
            || after.is_some_and(|k| at_level(k) && !lines[k].trim().starts_with(['}', ')', ']']))
        {
            out.push((with(i, i + 1, &[]), format!("line {} deleted (`{t}`)", i + 1)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repair::localise::Shown;

    const LIB: &str = "\"\"\"Fees: a / b and x + 1 in the docstring stay.\"\"\"\n\nRATE = 25\n\n\ndef days_late(due, returned):\n    \"\"\"Whole days (+ 1 here is prose).\"\"\"\n    return max((returned - due).days + 1, 0)  # + 1 in a comment stays\n\n\ndef fee(due, returned, member=False):\n    fee = min(days_late(due, returned) * RATE, 1000)\n    if member and fee > 0:\n        fee = fee / 2\n    return fee\n\n\ndef unrelated(x):\n    return x + 1\n";
    const TESTS: &str = "from lib import days_late, fee\n\n\ndef test_on_time():\n    assert days_late(10, 10) == 0\n\n\ndef test_member():\n    assert fee(10, 13, member=True) == 37\n";

    fn loc() -> Localised {
        Localised {
            failing: String::new(),
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
            ..Default::default()
        }
    }

    fn whats(ms: &[Mutant]) -> Vec<&str> {
        ms.iter().map(|m| m.what.as_str()).collect()
    }

    #[test]
    fn the_called_functions_lines_only_outside_strings_and_comments() {
        let ms = mutants(&loc(), &["test_lib.py::test_on_time".into()], 100);
        assert_eq!(
            whats(&ms),
            [
                "`max` → `min`, lib.py:8",
                "`-` → `+`, lib.py:8",
                "`+ 1` dropped, lib.py:8",
                "`+ 1` → `- 1`, lib.py:8",
            ]
        );
        let dropped = &ms[2];
        assert_eq!(dropped.path, "lib.py");
        assert!(
            dropped
                .content
                .contains("    return max((returned - due).days, 0)  # + 1 in a comment stays\n"),
            "{}",
            dropped.content
        );
        // Everything else byte for byte.
        assert_eq!(
            dropped
                .content
                .replacen("(returned - due).days, 0)", "(returned - due).days + 1, 0)", 1),
            LIB
        );
    }

    #[test]
    fn callees_of_called_functions_too_and_the_cap() {
        let ms = mutants(&loc(), &["test_member".into()], 100);
        let w = whats(&ms);
        // fee's own lines first, then days_late (which fee calls); never `unrelated`.
        assert_eq!(w[0], "`min` → `max`, lib.py:12");
        assert!(w.contains(&"`and` → `or`, lib.py:13"), "{w:?}");
        assert!(w.contains(&"`>` → `>=`, lib.py:13"), "{w:?}");
        assert!(w.contains(&"`/` → `//`, lib.py:14"), "{w:?}");
        assert!(w.contains(&"`+ 1` dropped, lib.py:8"), "{w:?}");
        assert!(!w.iter().any(|m| m.ends_with(":19")), "{w:?}");
        assert_eq!(mutants(&loc(), &["test_member".into()], 2).len(), 2);
        assert!(mutants(&loc(), &["test_member".into()], 0).is_empty());
        assert!(mutants(&loc(), &["test_nothing".into()], 100).is_empty());
    }

    #[test]
    fn masks_know_each_languages_strings_and_comments() {
        let mask = |t: &str, l| -> String {
            code_mask(t, l)
                .iter()
                .zip(t.chars())
                .map(|(c, ch)| if *c { ch } else { '.' })
                .collect()
        };
        assert_eq!(
            mask("a = 'x + 1' + b  # c - 1\nd", Lang::Python),
            "a = ....... + b  .......\nd"
        );
        assert_eq!(
            mask("s = \"\"\"\n- 1\n\"\"\" - 1", Lang::Python),
            "s = ........... - 1"
        );
        assert_eq!(
            mask(
                "let a = b - 1; // c + 1\n/* d\n+ 1 */ e",
                Lang::CLike { single_quote: false }
            ),
            "let a = b - 1; ........\n........... e"
        );
        // A Rust lifetime is not a quote.
        assert_eq!(
            mask(
                "fn f<'a>(x: &'a str) -> usize { x.len() - 1 }",
                Lang::CLike { single_quote: false }
            ),
            "fn f<'a>(x: &'a str) -> usize { x.len() - 1 }"
        );
        // An escaped quote does not end the string.
        assert_eq!(mask(r#"x = "a\"b" + 1"#, Lang::Python), r#"x = ...... + 1"#);
    }

    #[test]
    fn operators_that_are_not_comparisons_are_left() {
        let e = |l: &str, lang| -> Vec<String> {
            edits(l, &code_mask(l, lang), lang)
                .into_iter()
                .map(|e| e.what)
                .collect()
        };
        let rust = Lang::CLike { single_quote: false };
        // A generic, an arrow, a shift and `+=` are not mutated.
        assert!(e("fn f(v: Vec<u8>) -> u8 { v[0] << 2 }", rust).is_empty());
        assert!(e("x += 1", Lang::Python).is_empty());
        assert!(e("x //= 2; y /= 2", Lang::Python).is_empty());
        assert_eq!(
            e("if a <= b && c == d {", rust),
            ["`<=` → `<`", "`&&` → `||`", "`==` → `!=`"]
        );
        assert_eq!(e("x = a // 2", Lang::Python), ["`//` → `/`"]);
        // `10` is not `1`; `1.5` is not `1`.
        assert_eq!(e("y = n - 10", Lang::Python), ["`-` → `+`"]);
        assert_eq!(e("y = n - 1.5", Lang::Python), ["`-` → `+`"]);
        assert!(lang("notes.md").is_none());
    }

    /// Each edit of `l` applied alone: (what, the line after).
    fn applied(l: &str, lang: Lang) -> Vec<(String, String)> {
        edits(l, &code_mask(l, lang), lang)
            .into_iter()
            .map(|e| (e.what, format!("{}{}{}", &l[..e.start], e.with, &l[e.end..])))
            .collect()
    }

    #[test]
    fn brackets_for_a_precedence_mistake_and_a_range_one_further() {
        let after = |l: &str, lang, what: &str| -> Vec<String> {
            applied(l, lang)
                .into_iter()
                .filter(|(w, _)| w.contains(what))
                .map(|(_, l)| l)
                .collect()
        };
        let py = Lang::Python;
        assert_eq!(
            after("    return f - 32 * 5 / 9", py, "(a - b)"),
            ["    return (f - 32) * 5 / 9"]
        );
        assert_eq!(
            after("    total = item.price(tax) + rates[k] / 100", py, "(a + b)"),
            ["    total = (item.price(tax) + rates[k]) / 100"]
        );
        // Already bracketed, or no `*`//`/` after the right operand: nothing.
        assert!(after("    return (f - 32) * 5 / 9", py, "(a - b)").is_empty());
        assert!(after("    return a - b + c", py, "(a").is_empty());
        // `**`'s first star is a `*`, `-=` is no operator here.
        assert!(after("    x -= y * 2", py, "(a").is_empty());
        assert_eq!(
            after(
                "    return not user.suspended and user.id == doc.owner_id or user.is_admin",
                py,
                "x and (y or z)"
            ),
            ["    return not user.suspended and (user.id == doc.owner_id or user.is_admin)"]
        );
        assert_eq!(
            after("    if a and b or c:", py, "x and (y or z)"),
            ["    if a and (b or c):"]
        );
        // In a string, or `or` before `and`: nothing.
        assert!(after("    s = 'a and b or c'", py, "x and").is_empty());
        assert!(after("    return a or b and c", py, "x and").is_empty());
        assert_eq!(
            after("    for start in range(len(readings) - window):", py, "range()"),
            ["    for start in range(len(readings) - window + 1):"]
        );
        assert_eq!(
            after("    for i in range(1, n):", py, "range()"),
            ["    for i in range(1, n + 1):"]
        );
        // Already `± 1` (the other edits turn those), not Python, a name ending in `range`.
        assert!(after("    for i in range(n - 1):", py, "range()").is_empty());
        assert!(
            after(
                "for i in range(n) {",
                Lang::CLike { single_quote: true },
                "range()"
            )
            .is_empty()
        );
        assert!(after("    x = my_range(n)", py, "range()").is_empty());
    }

    #[test]
    fn a_rust_test_beside_the_code_finds_the_functions_it_calls() {
        let lib = "pub fn wrap(width: usize) -> usize {\n    width + 1\n}\n\n#[cfg(test)]\nmod tests {\n    use super::*;\n\n    #[test]\n    fn wraps() {\n        assert_eq!(wrap(3), 3);\n    }\n}\n";
        let loc = Localised {
            shown: vec![Shown {
                path: "src/lib.rs".into(),
                text: lib.into(),
                test: false,
            }],
            ..Default::default()
        };
        let ms = mutants(&loc, &["tests::wraps".into()], 100);
        assert!(
            whats(&ms).contains(&"`+ 1` dropped, src/lib.rs:2"),
            "{:?}",
            whats(&ms)
        );
    }

    fn structural_of(text: &str, name: &str, lang: Lang) -> Vec<(String, String)> {
        structural(text, name, lang)
    }

    #[test]
    fn a_mutable_default_becomes_a_new_one_each_call_after_the_docstring() {
        let text = "def new_playlist(name, tracks=[]):\n    \"\"\"A playlist.\"\"\"\n    return {\"name\": name, \"tracks\": tracks}\n";
        let got = structural_of(text, "new_playlist", Lang::Python);
        assert_eq!(got[0].1, "`tracks=[]` → `tracks=None`, a new one each call");
        assert_eq!(
            got[0].0,
            "def new_playlist(name, tracks=None):\n    \"\"\"A playlist.\"\"\"\n    if tracks is None:\n        tracks = []\n    return {\"name\": name, \"tracks\": tracks}\n"
        );
    }

    #[test]
    fn a_parameter_aliased_before_it_is_changed_becomes_a_copy() {
        let text = "def normalize(samples, target=1.0):\n    result = samples\n    for i, s in enumerate(result):\n        result[i] = s * target\n    return result\n";
        let got = structural_of(text, "normalize", Lang::Python);
        assert_eq!(got[0].1, "`result = samples` → a copy, line 2");
        assert!(got[0].0.contains("    result = samples.copy()\n"), "{}", got[0].0);
    }

    #[test]
    fn statement_deletion_takes_an_else_branch_or_a_line_with_a_sibling_never_a_whole_block() {
        let py = "def has_conflict(b, existing):\n    for other in existing:\n        if overlaps(b, other):\n            return True\n        else:\n            return False\n    return False\n";
        let got = structural_of(py, "has_conflict", Lang::Python);
        let whats: Vec<&str> = got.iter().map(|(_, w)| w.as_str()).collect();
        // `return True` alone in its block and the loop's lines that open blocks stay.
        assert_eq!(whats, ["`else` branch deleted, line 5"], "{got:?}");
        assert_eq!(
            got[0].0,
            "def has_conflict(b, existing):\n    for other in existing:\n        if overlaps(b, other):\n            return True\n    return False\n"
        );
        let js = "function total(xs) {\n  let t = 0;\n  t = 1;\n  if (xs) {\n    t += 1;\n  } else {\n    t = 0;\n  }\n  return t;\n}\n";
        let got = structural_of(js, "total", Lang::CLike { single_quote: true });
        let whats: Vec<&str> = got.iter().map(|(_, w)| w.as_str()).collect();
        assert_eq!(
            whats,
            ["line 3 deleted (`t = 1;`)", "`else` branch deleted, line 6"],
            "{got:?}"
        );
        assert!(got[1].0.contains("    t += 1;\n  }\n  return t;"), "{}", got[2].0);
    }
}
