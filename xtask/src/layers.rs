//! `cargo xtask layers`: the import circles inside each library crate.
//!
//! Each source file of a crate's `src/` (binaries left out) is a node, named
//! by its module path. An arrow runs from a file to the file that *defines*
//! an item it names through `crate::`, `super::` or `self::` (in `use`
//! trees or in paths inside the code): a name is followed through `pub use`
//! re-exports to its definition, and a module's `pub use` of its own
//! children is no arrow (a facade does not use what it re-exports). Unit-test modules (`#[cfg(test)] mod … {}`)
//! and comments are left out. A circle is a strongly connected set of two
//! or more files.
//!
//! CI fails when a crate has a circle that [`ALLOWED`] does not list with
//! its reason: none in rrpc-core, rrpc-ringbuf and rrpc-tonic, at most two
//! elsewhere. The reading is textual (no macro expansion, no type
//! inference): an arrow hidden in a macro is not seen, and an item named by
//! its bare name after a glob import is not followed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

// The crates checked: the library crates, as packaged.
use crate::package::CRATES;

/// Circles accepted, by crate and the sorted module paths of their files,
/// each with its reason. At most two per crate, and none in rrpc-core,
/// rrpc-ringbuf or rrpc-tonic.
pub(crate) const ALLOWED: &[(&str, &[&str], &str)] = &[(
    "rrpc-poller",
    &[
        "poller",
        "poller::registration",
        "poller::shard",
        "poller::thread",
    ],
    "one type in four files: registration, shard and the polling thread \
     work on the poller's shared state (`Inner`, its wake-up and lock \
     helpers), which `Poller` owns and drives; a leaf for that state would \
     have to open its fields to all four",
)];

/// Crates that may have no circle at all.
const NO_CIRCLES: &[&str] = &["rrpc-core", "rrpc-ringbuf", "rrpc-tonic"];

/// `cargo xtask layers` options.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct LayersArgs {
    /// Print every arrow of every crate, not only the circles.
    #[arg(long)]
    pub(crate) verbose: bool,
    /// Check another checkout (default: this workspace).
    #[arg(long)]
    pub(crate) root: Option<PathBuf>,
}

/// One file of a crate.
#[derive(Debug, Default)]
struct Module {
    /// Names the file defines (structs, functions, modules, ...).
    defs: BTreeSet<String>,
    /// Names the file re-exports (`pub use`), with the full path each
    /// stands for (`*` for a glob).
    reexports: Vec<(String, Vec<String>)>,
    /// Every path it names (`use` trees expanded), absolute from the crate
    /// root.
    refs: Vec<Vec<String>>,
}

/// A crate's files by module path (`""` for `lib.rs`).
type Crate = BTreeMap<String, Module>;

/// The module path of `file` under `src`.
fn module_path(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if parts.first().is_some_and(|p| p == "bin") || (parts.is_empty() && stem == "main") {
        return None;
    }
    if !(parts.is_empty() && stem == "lib" || stem == "mod") {
        parts.push(stem.to_owned());
    }
    Some(parts.join("::"))
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            rs_files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// `text` without comments, string literals' contents, and
/// `#[cfg(test)]`-gated inline modules.
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' {
            // Raw strings (r"…", r#"…"#) are rare in this code; a plain
            // string's escapes are skipped.
            out.push_str("\"\"");
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('"', '\'', '\n'); lifetimes pass through.
            let end = text[i + 1..].find('\'').map_or(b.len(), |k| i + 1 + k + 1);
            let end = if b[i + 1] == b'\\' && b.get(i + 2) == Some(&b'\'') {
                i + 4
            } else {
                end
            };
            out.push_str("' '");
            i = end.min(b.len());
        } else {
            let ch = text[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    drop_test_modules(&out)
}

/// `text` without `#[cfg(test)] mod name { … }` blocks.
fn drop_test_modules(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_mod = trimmed.starts_with("mod ") || trimmed.starts_with("pub(crate) mod ");
        let brace = trimmed.find('{');
        let semi = trimmed.find(';');
        match (is_mod, brace) {
            (true, Some(open)) if semi.is_none_or(|s| s > open) => {
                let skipped = after.len() - trimmed.len();
                let body = &trimmed[open..];
                let mut depth = 0usize;
                let mut end = body.len();
                for (k, c) in body.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &after[skipped + open + end..];
            }
            _ => {
                out.push_str("#[cfg(test)]");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands a `use` tree (`a::{b, c::d as e, f::*}`) into (local name,
/// path) pairs; the path is as written (relative).
fn expand_use(tree: &str, prefix: &[String], out: &mut Vec<(String, Vec<String>)>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let close = tree.rfind('}').unwrap_or(tree.len());
        let inner = &tree[open + 1..close];
        let mut p = prefix.to_vec();
        p.extend(head);
        let mut depth = 0;
        let mut start = 0;
        for (k, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use(&inner[start..k], &p, out);
                    start = k + 1;
                }
                _ => {}
            }
        }
        expand_use(&inner[start..], &p, out);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim())),
        None => (tree, None),
    };
    let mut p = prefix.to_vec();
    p.extend(
        path.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    );
    let Some(last) = p.last().cloned() else {
        return;
    };
    let name = match (alias, last.as_str()) {
        (Some(a), _) => a.to_owned(),
        (None, "self") => {
            p.pop();
            p.last().cloned().unwrap_or_default()
        }
        (None, _) => last.clone(),
    };
    if last == "self" && alias.is_some() {
        p.pop();
    }
    out.push((name, p));
}

/// Makes a written path absolute from the crate root, as seen from module
/// `here`; `None` for paths into other crates.
fn absolute(path: &[String], here: &str, krate: &Crate) -> Option<Vec<String>> {
    let mut cur: Vec<String> = if here.is_empty() {
        Vec::new()
    } else {
        here.split("::").map(str::to_owned).collect()
    };
    let mut it = path.iter().peekable();
    match it.peek().map(|s| s.as_str()) {
        Some("crate") => {
            it.next();
            cur.clear();
        }
        Some("self") => {
            it.next();
        }
        Some("super") => {
            while it.peek().is_some_and(|s| *s == "super") {
                it.next();
                cur.pop();
            }
        }
        Some(first) => {
            // Uniform paths: a child module of `here` (`pub use dial::x`).
            let mut child = cur.clone();
            child.push(first.to_owned());
            if !krate.contains_key(&child.join("::")) {
                return None;
            }
        }
        None => return None,
    }
    cur.extend(it.cloned());
    Some(cur)
}

/// What [`read_module`] finds in a file: its definitions, its `use` trees
/// (and whether each is `pub`), and the paths it names in code.
type Read = (BTreeSet<String>, Vec<(bool, String)>, Vec<Vec<String>>);

/// Reads one file into a [`Module`]; paths stay relative until every file
/// is known.
fn read_module(text: &str) -> Read {
    let code = strip(text);
    let mut defs = BTreeSet::new();
    let mut uses = Vec::new();
    let mut inline = Vec::new();
    const KINDS: &[&str] = &[
        "struct", "enum", "fn", "trait", "type", "const", "static", "union", "mod",
    ];
    // Definitions: `<kind> <Name>` after a visibility and qualifiers.
    let words: Vec<&str> = code
        .split(|c: char| !is_ident(c) && c != '!')
        .filter(|w| !w.is_empty())
        .collect();
    for w in words.windows(2) {
        if KINDS.contains(&w[0]) || w[0] == "macro_rules!" {
            defs.insert(w[1].to_owned());
        }
    }
    // `use` statements (possibly `pub use`), to their `;`.
    let mut rest = code.as_str();
    while let Some(at) = find_word(rest, "use") {
        let before = rest[..at].trim_end();
        let public = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
        let stmt_end = rest[at..].find(';').map_or(rest.len(), |k| at + k);
        let tree = rest[at + 3..stmt_end].trim();
        uses.push((public, tree.to_owned()));
        rest = &rest[stmt_end.min(rest.len())..];
        if rest.is_empty() {
            break;
        }
        rest = &rest[1..];
    }
    // Paths in code: `crate::a::b`, `super::a`, `self::a` outside `use`.
    for anchor in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(k) = code[from..].find(anchor) {
            let start = from + k;
            from = start + anchor.len();
            if start > 0
                && code[..start]
                    .chars()
                    .next_back()
                    .is_some_and(|c| is_ident(c) || c == ':')
            {
                continue;
            }
            let path: String = code[start..]
                .chars()
                .take_while(|c| is_ident(*c) || *c == ':')
                .collect();
            let segs: Vec<String> = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            if segs.len() > 1 {
                inline.push(segs);
            }
        }
    }
    (defs, uses, inline)
}

/// The start of `word` as a whole word in `s`.
fn find_word(s: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(k) = s[from..].find(word) {
        let at = from + k;
        let before_ok = at == 0 || !s[..at].chars().next_back().is_some_and(is_ident);
        let after_ok = !s[at + word.len()..].chars().next().is_some_and(is_ident);
        if before_ok && after_ok {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// Reads a crate's `src/`.
fn read_crate(src: &Path) -> Result<Crate> {
    let mut files = Vec::new();
    rs_files(src, &mut files)?;
    let mut raw = Vec::new();
    let mut krate = Crate::new();
    for f in files {
        let Some(m) = module_path(src, &f) else {
            continue;
        };
        let text = std::fs::read_to_string(&f)?;
        raw.push((m.clone(), read_module(&text)));
        krate.insert(m, Module::default());
    }
    for (m, (defs, uses, inline)) in raw {
        let mut reexports = Vec::new();
        let mut refs = Vec::new();
        for (public, tree) in uses {
            let mut pairs = Vec::new();
            expand_use(&tree, &[], &mut pairs);
            for (name, path) in pairs {
                // `use super::*` is what inline modules (`mod verbs { … }`)
                // say of their own file; read as the parent, it would be a
                // false arrow.
                if path.first().is_some_and(|s| s == "super") && name == "*" {
                    continue;
                }
                let Some(abs) = absolute(&path, &m, &krate) else {
                    continue;
                };
                if public {
                    reexports.push((name, abs.clone()));
                    // A module re-exporting its own children is their
                    // facade, not their user: no arrow.
                    let own: Vec<&str> = m.split("::").filter(|s| !s.is_empty()).collect();
                    if abs.len() > own.len() && abs.iter().zip(&own).all(|(a, b)| a == b) {
                        continue;
                    }
                }
                refs.push(abs);
            }
        }
        for p in inline {
            if let Some(abs) = absolute(&p, &m, &krate) {
                refs.push(abs);
            }
        }
        let e = krate.get_mut(&m).expect("inserted above");
        e.defs = defs;
        e.reexports = reexports;
        e.refs = refs;
    }
    Ok(krate)
}

/// The file that defines what `path` names.
fn resolve(krate: &Crate, path: &[String], depth: usize) -> Option<String> {
    if depth > 16 {
        return None;
    }
    let mut cur: Vec<String> = Vec::new();
    for (i, seg) in path.iter().enumerate() {
        if seg == "*" {
            return Some(cur.join("::"));
        }
        let mut child = cur.clone();
        child.push(seg.clone());
        if krate.contains_key(&child.join("::")) {
            cur = child;
            continue;
        }
        let here = cur.join("::");
        let module = krate.get(&here)?;
        if module.defs.contains(seg) {
            return Some(here);
        }
        for (name, target) in &module.reexports {
            if name == seg {
                let mut t = target.clone();
                t.extend(path[i + 1..].iter().cloned());
                return resolve(krate, &t, depth + 1).or(Some(here));
            }
        }
        for (name, target) in &module.reexports {
            if name == "*" {
                let mut t = target.clone();
                t.pop();
                t.extend(path[i..].iter().cloned());
                if let Some(found) = resolve(krate, &t, depth + 1) {
                    return Some(found);
                }
            }
        }
        return Some(here);
    }
    Some(cur.join("::"))
}

/// Arrows between files: from → to → the names that tie them.
type Arrows = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn arrows(krate: &Crate) -> Arrows {
    let mut out = Arrows::new();
    for (from, m) in krate {
        for r in &m.refs {
            let Some(to) = resolve(krate, r, 0) else {
                continue;
            };
            if &to == from {
                continue;
            }
            // A module's own declaration of its children is not an arrow
            // back up; `from` naming its parent's item is.
            out.entry(from.clone())
                .or_default()
                .entry(to)
                .or_default()
                .insert(r.last().cloned().unwrap_or_default());
        }
    }
    out
}

/// Strongly connected sets of two or more files (Tarjan).
fn circles(nodes: &[String], arrows: &Arrows) -> Vec<Vec<String>> {
    struct T<'a> {
        arrows: &'a Arrows,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on: BTreeSet<String>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit(t: &mut T<'_>, v: &str) {
        t.index.insert(v.to_owned(), t.next);
        t.low.insert(v.to_owned(), t.next);
        t.next += 1;
        t.stack.push(v.to_owned());
        t.on.insert(v.to_owned());
        let succ: Vec<String> = t
            .arrows
            .get(v)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for w in succ {
            if !t.index.contains_key(&w) {
                visit(t, &w);
                let lw = t.low[&w];
                let lv = t.low.get_mut(v).expect("set above");
                *lv = (*lv).min(lw);
            } else if t.on.contains(&w) {
                let iw = t.index[&w];
                let lv = t.low.get_mut(v).expect("set above");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(&w);
                let done = w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        arrows,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for n in nodes {
        if !t.index.contains_key(n) {
            visit(&mut t, n);
        }
    }
    t.out
}

fn show(m: &str) -> &str {
    if m.is_empty() { "lib" } else { m }
}

/// Prints each crate's circles; fails on one that [`ALLOWED`] does not list.
pub(crate) fn run(root: &Path, args: &LayersArgs) -> Result<()> {
    let root = args.root.as_deref().unwrap_or(root);
    let mut unexplained = Vec::new();
    for name in CRATES {
        let src = root.join("crates").join(name).join("src");
        let krate = read_crate(&src)?;
        let nodes: Vec<String> = krate.keys().cloned().collect();
        let arrows = arrows(&krate);
        let found = circles(&nodes, &arrows);
        let n_arrows: usize = arrows.values().map(BTreeMap::len).sum();
        eprintln!(
            "{name}: {} files, {n_arrows} arrows, {} circle(s)",
            nodes.len(),
            found.len()
        );
        if args.verbose {
            for (from, tos) in &arrows {
                for (to, names) in tos {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    eprintln!("  {} -> {}: {}", show(from), show(to), names.join(", "));
                }
            }
        }
        for c in &found {
            let allowed =
                ALLOWED
                    .iter()
                    .filter(|_| !NO_CIRCLES.contains(name))
                    .find(|(k, files, _)| {
                        k == name && files.iter().copied().eq(c.iter().map(String::as_str))
                    });
            match allowed {
                Some((_, _, why)) => eprintln!("  circle (allowed: {why}): {}", c.join(", ")),
                None => {
                    eprintln!("  CIRCLE: {}", c.join(", "));
                    unexplained.push(format!("{name}: {}", c.join(", ")));
                }
            }
            for from in c {
                for (to, names) in arrows.get(from).into_iter().flatten() {
                    if c.contains(to) {
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        eprintln!("    {} -> {}: {}", show(from), show(to), names.join(", "));
                    }
                }
            }
        }
    }
    if !unexplained.is_empty() {
        bail!(
            "import circles inside a crate ({}): break them, or list them with a reason in \
             xtask/src/layers.rs ALLOWED",
            unexplained.join("; ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn krate(files: &[(&str, &str)]) -> (Crate, Arrows) {
        let dir = std::env::temp_dir().join(format!(
            "xtask-layers-{}-{}",
            std::process::id(),
            files.len() + files.iter().map(|f| f.1.len()).sum::<usize>()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let k = read_crate(&dir).unwrap();
        let a = arrows(&k);
        std::fs::remove_dir_all(&dir).unwrap();
        (k, a)
    }

    fn found(files: &[(&str, &str)]) -> Vec<Vec<String>> {
        let (k, a) = krate(files);
        let nodes: Vec<String> = k.keys().cloned().collect();
        circles(&nodes, &a)
    }

    #[test]
    fn the_allowed_circles_keep_the_policy() {
        for name in CRATES {
            let n = ALLOWED.iter().filter(|(k, _, _)| k == name).count();
            let most = if NO_CIRCLES.contains(name) { 0 } else { 2 };
            assert!(n <= most, "{name}: {n} allowed circles, at most {most}");
        }
        for (_, files, why) in ALLOWED {
            assert!(files.windows(2).all(|w| w[0] < w[1]), "{files:?}: sorted");
            assert!(why.len() > 20, "a reason for {files:?}");
        }
    }

    #[test]
    fn a_circle_through_use_is_found() {
        let c = found(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            ("b.rs", "use crate::a::A;\npub struct B;\n"),
        ]);
        assert_eq!(c, vec![vec!["a".to_owned(), "b".to_owned()]]);
    }

    #[test]
    fn a_reexport_is_followed_to_its_definition() {
        // lib re-exports b's B; a names crate::B, and b names a: no circle
        // between a and lib, and the arrow lands on b (a circle a <-> b).
        let c = found(&[
            ("lib.rs", "mod a;\nmod b;\npub use b::B;\n"),
            (
                "a.rs",
                "pub fn f() -> crate::B { todo!() }\npub struct A;\n",
            ),
            ("b.rs", "use crate::a::A;\npub struct B;\n"),
        ]);
        assert_eq!(c, vec![vec!["a".to_owned(), "b".to_owned()]]);
        let c = found(&[
            ("lib.rs", "mod a;\nmod b;\npub use b::B;\n"),
            ("a.rs", "pub fn f() -> crate::B { todo!() }\n"),
            ("b.rs", "pub struct B;\n"),
        ]);
        assert!(c.is_empty(), "{c:?}");
    }

    #[test]
    fn test_modules_comments_and_strings_are_not_arrows() {
        let c = found(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            (
                "a.rs",
                "// use crate::b::B;\npub struct A;\nconst S: &str = \"crate::b::B\";\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}\n",
            ),
            ("b.rs", "use crate::a::A;\npub struct B;\n"),
        ]);
        assert!(c.is_empty(), "{c:?}");
    }

    #[test]
    fn nested_use_trees_and_super_paths() {
        let c = found(&[
            ("lib.rs", "mod p;\n"),
            ("p/mod.rs", "mod x;\nmod y;\npub struct P;\n"),
            (
                "p/x.rs",
                "use super::{y::{Y, self as why}, P};\npub struct X;\n",
            ),
            ("p/y.rs", "use crate::p::x::X;\npub struct Y;\n"),
        ]);
        assert_eq!(c, vec![vec!["p::x".to_owned(), "p::y".to_owned()]]);
    }
}
