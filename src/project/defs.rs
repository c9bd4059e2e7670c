//! The top-level definitions of a source file, by its language, read line by line from the
//! text (no parser): enough to tell that a rewrite dropped most of a file's functions, which is
//! what a 1.5B model's `write_file` did to the demo (the whole module replaced by `fee = 37`).
//!
//! Understood: Python (`def`, `async def`, `class`, module-level assignments), Rust (`fn`, `struct`, `enum`, `trait`,
//! `impl`, `mod`, `const`, `static`, `type`, `macro_rules!`, with `pub` and the other
//! qualifiers), JavaScript and TypeScript (`function`, `class`, `const`/`let`/`var`,
//! `interface`, `type`, `enum`, with `export`, `default` and `async`), and Go (`func`,
//! methods as `Type.Name`, `type`, `const`, `var`). Other files have no definitions to lose.

/// The languages [`top_level`] reads, for the book (docs/src/commands/run.md) and error messages.
pub const LANGUAGES: &str = "Python, Rust, JavaScript/TypeScript and Go";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lang {
    Python,
    Rust,
    Js,
    Go,
}

fn lang_of(path: &str) -> Option<Lang> {
    let ext = path.rsplit_once('.').map(|(_, e)| e)?;
    match ext {
        "py" | "pyi" => Some(Lang::Python),
        "rs" => Some(Lang::Rust),
        "js" | "mjs" | "cjs" | "jsx" | "ts" | "tsx" | "mts" | "cts" => Some(Lang::Js),
        "go" => Some(Lang::Go),
        _ => None,
    }
}

/// The names defined at the top level of `text`, in order (each once); `None` when the
/// language of `path` is not one of [`LANGUAGES`].
pub fn top_level(path: &str, text: &str) -> Option<Vec<String>> {
    let lang = lang_of(path)?;
    let mut names: Vec<String> = Vec::new();
    let mut go_block = false; // inside `const (`, `var (` or `type (`
    for line in text.lines() {
        if go_block {
            if line.trim_start().starts_with(')') {
                go_block = false;
            } else if (line.starts_with('\t') || line.starts_with("    "))
                && let Some(n) = ident(line.trim_start())
            {
                push(&mut names, n);
            }
            continue;
        }
        // Top level: the line starts at column 0.
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        let found = match lang {
            Lang::Python => python(line),
            Lang::Rust => rust(line),
            Lang::Js => js(line),
            Lang::Go => {
                for kind in ["const", "var", "type"] {
                    if let Some(rest) = line.strip_prefix(kind)
                        && rest.trim_start().starts_with('(')
                    {
                        go_block = true;
                    }
                }
                if go_block { None } else { go(line) }
            }
        };
        if let Some(n) = found {
            push(&mut names, n);
        }
    }
    Some(names)
}

fn push(names: &mut Vec<String>, name: String) {
    if !names.contains(&name) {
        names.push(name);
    }
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> Option<String> {
    let n: String = s
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
        .collect();
    (!n.is_empty() && !n.starts_with(|c: char| c.is_ascii_digit())).then_some(n)
}

/// `line` without its indentation and the leading words in `skip` (qualifiers: `pub`,
/// `async`, `export`), in any order.
pub fn without_qualifiers<'a>(line: &'a str, skip: &[&str]) -> &'a str {
    let mut rest = line.trim_start();
    loop {
        let before = rest;
        for q in skip {
            if let Some(r) = rest.strip_prefix(q)
                && (r.starts_with(char::is_whitespace) || q.ends_with(')'))
            {
                rest = r.trim_start();
            }
        }
        if rest == before {
            return rest;
        }
    }
}

/// `line` without the leading words in `skip` (qualifiers), then after `keyword`, the name.
fn after(line: &str, skip: &[&str], keywords: &[&str]) -> Option<String> {
    let rest = without_qualifiers(line, skip);
    for k in keywords {
        if let Some(r) = rest.strip_prefix(k)
            && r.starts_with(char::is_whitespace)
        {
            return ident(r.trim_start());
        }
    }
    None
}

fn python(line: &str) -> Option<String> {
    after(line, &["async"], &["def", "class"]).or_else(|| {
        // A module-level assignment: `RATE = 3`, `RATE: int = 3` (not `x == y`, not `a.b = c`).
        let name = ident(line)?;
        let rest = line[name.len()..].trim_start();
        let assigns =
            rest.starts_with('=') && !rest.starts_with("==") || rest.starts_with(':') && rest.contains('=');
        let keyword = [
            "if", "for", "while", "with", "try", "else", "elif", "return", "import", "from", "print",
        ];
        (assigns && !keyword.contains(&name.as_str())).then_some(name)
    })
}

fn rust(line: &str) -> Option<String> {
    if let Some(r) = line.strip_prefix("macro_rules!") {
        return ident(r.trim_start());
    }
    let skip = [
        "pub(crate)",
        "pub(super)",
        "pub(self)",
        "pub",
        "async",
        "unsafe",
        "const fn",
        "extern \"C\"",
    ];
    if let Some(r) = line.trim_start().strip_prefix("const fn") {
        return ident(r.trim_start());
    }
    // `impl Trait for Type` and `impl<T> Type<T>`: the implemented type, with the trait.
    let stripped = skip
        .iter()
        .fold(line, |l, q| l.strip_prefix(q).map_or(l, str::trim_start));
    if let Some(r) = stripped.strip_prefix("impl")
        && (r.starts_with(char::is_whitespace) || r.starts_with('<'))
    {
        let head = r.split('{').next().unwrap_or(r).trim();
        return (!head.is_empty())
            .then(|| format!("impl {}", head.split_whitespace().collect::<Vec<_>>().join(" ")));
    }
    after(
        line,
        &skip,
        &[
            "fn", "struct", "enum", "trait", "mod", "const", "static", "type", "union",
        ],
    )
}

fn js(line: &str) -> Option<String> {
    after(
        line,
        &["export", "default", "async", "declare", "abstract"],
        &[
            "function",
            "function*",
            "class",
            "const",
            "let",
            "var",
            "interface",
            "type",
            "enum",
        ],
    )
}

fn go(line: &str) -> Option<String> {
    if let Some(r) = line.strip_prefix("func") {
        let r = r.trim_start();
        // A method: `func (r *Recv) Name(`.
        if let Some(recv) = r.strip_prefix('(') {
            let (inside, rest) = recv.split_once(')')?;
            let ty = inside.split_whitespace().last()?.trim_start_matches('*');
            let ty: String = ty
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            return ident(rest.trim_start()).map(|n| format!("{ty}.{n}"));
        }
        return ident(r);
    }
    after(line, &[], &["type", "const", "var"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_language_gives_its_top_level_names() {
        let py = "\"\"\"Doc.\"\"\"\nimport x\n\nRATE = 3\n\ndef days_late(a):\n    def inner():\n        pass\n\nasync def fetch():\n    pass\n\nclass Ledger(Base):\n    def method(self):\n        pass\n";
        assert_eq!(
            top_level("lib.py", py).unwrap(),
            ["RATE", "days_late", "fetch", "Ledger"]
        );
        let rs = "use std::fmt;\n\npub struct Point { x: i32 }\n\nimpl fmt::Display for Point {\n    fn fmt(&self) {}\n}\n\npub(crate) fn wrap(text: &str) {}\n\nconst MAX: usize = 3;\n\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n";
        assert_eq!(
            top_level("src/lib.rs", rs).unwrap(),
            ["Point", "impl fmt::Display for Point", "wrap", "MAX", "tests"]
        );
        let js = "\"use strict\";\n\nfunction slugify(t) {\n  const x = 1;\n}\n\nexport async function load() {}\nconst UNITS = [];\nclass Cart {}\nmodule.exports = { slugify };\n";
        assert_eq!(
            top_level("slug.js", js).unwrap(),
            ["slugify", "load", "UNITS", "Cart"]
        );
        let go = "package roman\n\nimport \"strings\"\n\nvar values = []int{1}\n\nconst (\n\tA = 1\n\tB = 2\n)\n\ntype Count struct {\n\tWord string\n}\n\nfunc ToRoman(n int) string {\n}\n\nfunc (c *Count) String() string {\n}\n";
        assert_eq!(
            top_level("roman.go", go).unwrap(),
            ["values", "A", "B", "Count", "ToRoman", "Count.String"]
        );
        assert_eq!(top_level("notes.txt", "def x():"), None);
    }
}
