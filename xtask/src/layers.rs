//! `cargo xtask layers`: the import circles inside each library crate, and
//! the layer order a crate declares.
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
//! its reason: none in the crates of [`NO_CIRCLES`] (rrpc-core,
//! rrpc-ringbuf, rrpc-poller and rrpc-tonic), at most two elsewhere.
//!
//! A crate may also declare its layers ([`ORDERS`]), from the bottom (the
//! leaves) up, as docs/architecture.md lists them: a module imports only
//! modules of its own layer or of a layer before it in the list. CI fails
//! on an arrow from a layer to a later one (a *back-arrow*) that
//! [`BACK_ARROWS`] does not list with its reason, on a listed one that is
//! gone, and on a module that no layer places.
//!
//! The reading is textual (no macro expansion, no type inference): an
//! arrow hidden in a macro is not seen, and an item named by its bare name
//! after a glob import is not followed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

// The crates checked: the library crates, as packaged.
use crate::package::CRATES;

/// Circles accepted, by crate and the sorted module paths of their files,
/// each with its reason. At most two per crate, and none in the crates of
/// [`NO_CIRCLES`].
pub(crate) const ALLOWED: &[(&str, &[&str], &str)] = &[];

/// Crates that may have no circle at all.
const NO_CIRCLES: &[&str] = &["rrpc-core", "rrpc-ringbuf", "rrpc-poller", "rrpc-tonic"];

/// The most circles [`ALLOWED`] may list for a crate not in [`NO_CIRCLES`].
const MOST_ALLOWED: usize = 2;

/// A crate's layers from the bottom up, each a list of module-path
/// prefixes (`"proto"` places `proto` and every module under it; the
/// longest prefix that matches places a module). The crate root (`lib.rs`)
/// is above every layer. A module may import the modules of its own layer
/// and of the layers before it.
type Order = &'static [&'static [&'static str]];

/// The declared layer orders, by crate (docs/architecture.md, "Inside each
/// crate", says the same). To check another crate, add its order here.
pub(crate) const ORDERS: &[(&str, Order)] = &[
    ("rrpc-core", CORE),
    ("rrpc-ringbuf", RINGBUF),
    ("rrpc-poller", POLLER),
    ("rrpc-tonic", TONIC),
];

/// rrpc-core, bottom up.
const CORE: Order = &[
    // Plain data and OS helpers.
    &[
        "error", "work", "settings", "fail", "addr", "fault", "sys", "numa", "region",
    ],
    // What the providers and the connections share: the hello codec, the
    // grant budget, the connection settings and what a hello carries.
    &[
        "handshake",
        "conn::budget",
        "conn::settings",
        "conn::exchange",
    ],
    // The providers' data path (side channels apart, below).
    &["provider"],
    // The public faces over it.
    &["cq", "qp", "fabric", "vqp"],
    // The side channels: a queue pair's exchange over TCP or a Unix socket.
    &[
        "provider::side",
        "provider::shm::side",
        "provider::verbs::side",
    ],
    // Dial and accept, the established connection, logical connections;
    // KRCore's pool and caches beside them.
    &["conn", "pool", "meta"],
    // Test and fuzz helpers.
    &["testing", "fuzzing"],
];

/// rrpc-ringbuf, bottom up.
const RINGBUF: Order = &[
    &["error", "proto::layout", "mem"],
    &["config"],
    &["proto"],
    &["driver"],
];

/// rrpc-poller, bottom up.
const POLLER: Order = &[
    // Plain data and the sans-IO decisions.
    &["error", "backoff", "tune", "source", "stats"],
    &["config", "sys"],
    &["report"],
    // The poller, from its shards up to its facade.
    &["poller::shard"],
    &["poller::thread", "poller::placement"],
    &["poller::inner"],
    &["poller::registration"],
    &["poller"],
    &["poller::tests", "rings"],
];

/// rrpc-tonic, bottom up: the connection (`conn`), then the two paths
/// over it (`fast`, `h2stream`), then the two sides (`client`, `server`).
const TONIC: Order = &[
    // Plain data and codecs: the error type, the fast path's frames, what
    // every call path shares, ring encryption's sans-IO sealing.
    &["error", "frame", "call", "conn::seal"],
    // Settings only.
    &["config"],
    // The fast path's sans-IO core: both sides' calls, windows, deadlines.
    &["fast::proto"],
    // The connection's two halves (`conn.rs`: its send side `Link`, its
    // receive side `MsgRx`, the two as a `Pipe`), a sealed pipe.
    &["conn", "conn::seal::pipe"],
    // What a connection negotiates and is made of ahead: the path
    // negotiation, KRCore's bundles, shared queue pairs, spares.
    &[
        "conn::negotiate",
        "conn::bundle",
        "conn::sharing",
        "conn::spare",
    ],
    // The runtime state servers and channels share: the pools and caches
    // of the layer before.
    &["context"],
    // The message pipe over rings (`shm://`, `rdma://`).
    &["conn::rings"],
    // TLS; the `rrpc://` port's messages and limits.
    &["tls", "port::hello", "port::limits"],
    // `rrpc://`: one TCP port, the fabric negotiation.
    &["port"],
    // URIs: what each scheme dials and listens on.
    &["transport"],
    // The fast path over a connection: its frame writer, the per-call flow
    // control, the client's receive (demux), the response body both sides
    // read (`fast`'s `RecvBody`, generic over where its events come from),
    // the client, the server.
    &["fast::writer"],
    &["fast::flow"],
    &["fast::client::demux"],
    &["fast"],
    &["fast::client"],
    &["fast::server"],
    // The HTTP/2 path over a connection, both sides.
    &["h2stream"],
    // The client side: the reconnecting connection, the channel, the
    // endpoint that builds it.
    &["client::managed"],
    &["client::channel"],
    &["client::endpoint", "client"],
    // The server side: the fast path's dispatch, then the server.
    &["server::dispatch"],
    &["server"],
    // Unit-test files and fuzz entry points.
    &[
        "config::tests",
        "conn::tests",
        "fast::proto::pair",
        "fast::proto::tests",
        "fuzzing",
    ],
];

/// Back-arrows accepted against a declared order: (crate, from, to,
/// reason), `from` and `to` module paths as `--verbose` prints them.
pub(crate) const BACK_ARROWS: &[(&str, &str, &str, &str)] = &[];

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
    // Bare paths in code (`client::SlotRef`), outside `use` statements
    // (whose nested trees hold relative paths): [`absolute`] keeps those
    // whose first segment is a child module of the file.
    let mut stmts = String::with_capacity(code.len());
    let mut rest = code.as_str();
    while let Some(at) = find_word(rest, "use") {
        stmts.push_str(&rest[..at]);
        let end = rest[at..].find(';').map_or(rest.len(), |k| at + k + 1);
        rest = &rest[end..];
    }
    stmts.push_str(rest);
    let b = stmts.as_bytes();
    let mut k = 0;
    while k < b.len() {
        let starts = is_ident(b[k] as char)
            && !b[k].is_ascii_digit()
            && (k == 0 || !(is_ident(b[k - 1] as char) || b[k - 1] == b':'));
        if !starts {
            k += 1;
            continue;
        }
        let path: String = stmts[k..]
            .chars()
            .take_while(|c| is_ident(*c) || *c == ':')
            .collect();
        k += path.len().max(1);
        let segs: Vec<String> = path
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if segs.len() > 1 && !["crate", "super", "self"].contains(&segs[0].as_str()) {
            inline.push(segs);
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

/// The layer of `module` in `order` (0 at the bottom): that of its longest
/// matching prefix; the crate root is above every layer. `None`: no layer
/// places it.
fn layer_of(order: Order, module: &str) -> Option<usize> {
    if module.is_empty() {
        return Some(order.len());
    }
    let mut best: Option<(usize, usize)> = None;
    for (layer, prefixes) in order.iter().enumerate() {
        for p in *prefixes {
            let hit = module
                .strip_prefix(p)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"));
            if hit && best.is_none_or(|(len, _)| p.len() > len) {
                best = Some((p.len(), layer));
            }
        }
    }
    best.map(|(_, layer)| layer)
}

/// What a declared order finds in a crate.
#[derive(Debug, Default, PartialEq)]
struct OrderFound {
    /// Modules that no layer places.
    unplaced: Vec<String>,
    /// Arrows from a layer to a later one: (from, to, the names that tie
    /// them).
    back: Vec<(String, String, Vec<String>)>,
}

fn check_order(order: Order, nodes: &[String], arrows: &Arrows) -> OrderFound {
    let mut found = OrderFound::default();
    for n in nodes {
        if layer_of(order, n).is_none() {
            found.unplaced.push(n.clone());
        }
    }
    for (from, tos) in arrows {
        for (to, names) in tos {
            if let (Some(f), Some(t)) = (layer_of(order, from), layer_of(order, to))
                && t > f
            {
                let names = names.iter().cloned().collect();
                found.back.push((from.clone(), to.clone(), names));
            }
        }
    }
    found
}

/// What breaks the policy in the lists of this file: more allowed circles
/// than a crate may have, an unsorted or unexplained one, an order that
/// places a prefix twice, an unexplained back-arrow or one of a crate that
/// declares no order.
fn policy_errors(
    allowed: &[(&str, &[&str], &str)],
    orders: &[(&str, Order)],
    back: &[(&str, &str, &str, &str)],
) -> Vec<String> {
    let mut errors = Vec::new();
    for name in CRATES {
        let n = allowed.iter().filter(|(k, _, _)| k == name).count();
        let most = if NO_CIRCLES.contains(name) {
            0
        } else {
            MOST_ALLOWED
        };
        if n > most {
            errors.push(format!("{name}: {n} allowed circles, at most {most}"));
        }
    }
    for (name, files, why) in allowed {
        if !CRATES.contains(name) {
            errors.push(format!("{name}: an allowed circle of no checked crate"));
        }
        if !files.windows(2).all(|w| w[0] < w[1]) {
            errors.push(format!("{name}: {files:?} not sorted"));
        }
        if why.len() <= 20 {
            errors.push(format!("{name}: no reason for the circle {files:?}"));
        }
    }
    for (name, order) in orders {
        if !CRATES.contains(name) {
            errors.push(format!("{name}: an order of no checked crate"));
        }
        let mut seen = BTreeSet::new();
        for p in order.iter().flat_map(|l| l.iter()) {
            if !seen.insert(*p) {
                errors.push(format!("{name}: {p} placed twice"));
            }
        }
        if order.iter().any(|l| l.is_empty()) {
            errors.push(format!("{name}: an empty layer"));
        }
    }
    for (name, from, to, why) in back {
        if !orders.iter().any(|(k, _)| k == name) {
            errors.push(format!("{name}: a back-arrow {from} -> {to}, but no order"));
        }
        if why.len() <= 20 {
            errors.push(format!(
                "{name}: no reason for the back-arrow {from} -> {to}"
            ));
        }
    }
    errors
}

/// Prints a crate's circles; returns those that [`ALLOWED`] does not list.
fn report_circles(name: &str, arrows: &Arrows, found: &[Vec<String>]) -> Vec<String> {
    let mut unexplained = Vec::new();
    for c in found {
        let allowed =
            ALLOWED
                .iter()
                .filter(|_| !NO_CIRCLES.contains(&name))
                .find(|(k, files, _)| {
                    *k == name && files.iter().copied().eq(c.iter().map(String::as_str))
                });
        match allowed {
            Some((_, _, why)) => eprintln!("  circle (allowed: {why}): {}", c.join(", ")),
            None => {
                eprintln!("  CIRCLE: {}", c.join(", "));
                unexplained.push(format!("{name}: circle {}", c.join(", ")));
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
    unexplained
}

/// Prints what a crate's declared order finds; returns what breaks it: a
/// module in no layer, a back-arrow that `listed` ([`BACK_ARROWS`]) does
/// not list, a listed one that is gone.
fn report_order(
    name: &str,
    order: Order,
    found: &OrderFound,
    listed: &[(&str, &str, &str, &str)],
) -> Vec<String> {
    let mut failures = Vec::new();
    eprintln!(
        "  order: {} layers, {} back-arrow(s)",
        order.len(),
        found.back.len()
    );
    for m in &found.unplaced {
        eprintln!("  UNPLACED: {m}");
        failures.push(format!("{name}: {m} is in no layer of its order"));
    }
    for (from, to, names) in &found.back {
        let (from, to) = (show(from), show(to));
        let why = listed
            .iter()
            .find(|(k, f, t, _)| *k == name && *f == from && *t == to);
        match why {
            Some((.., why)) => eprintln!(
                "  back-arrow (allowed: {why}): {from} -> {to}: {}",
                names.join(", ")
            ),
            None => {
                eprintln!("  BACK-ARROW: {from} -> {to}: {}", names.join(", "));
                failures.push(format!("{name}: back-arrow {from} -> {to}"));
            }
        }
    }
    for (_, f, t, _) in listed.iter().filter(|(k, ..)| *k == name) {
        if !found
            .back
            .iter()
            .any(|(from, to, _)| show(from) == *f && show(to) == *t)
        {
            eprintln!("  GONE: the listed back-arrow {f} -> {t}");
            failures.push(format!("{name}: listed back-arrow {f} -> {t} is gone"));
        }
    }
    failures
}

/// Prints each crate's circles and layer order; fails on a circle that
/// [`ALLOWED`] does not list, and on what breaks a declared order.
pub(crate) fn run(root: &Path, args: &LayersArgs) -> Result<()> {
    let root = args.root.as_deref().unwrap_or(root);
    let mut failures = policy_errors(ALLOWED, ORDERS, BACK_ARROWS);
    for name in CRATES {
        let src = root.join("crates").join(name).join("src");
        let krate = read_crate(&src)?;
        let nodes: Vec<String> = krate.keys().cloned().collect();
        let arrows = arrows(&krate);
        let found = circles(&nodes, &arrows);
        let order = ORDERS.iter().find(|(k, _)| k == name).map(|(_, o)| *o);
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
        failures.extend(report_circles(name, &arrows, &found));
        if let Some(order) = order {
            let found = check_order(order, &nodes, &arrows);
            failures.extend(report_order(name, order, &found, BACK_ARROWS));
        }
    }
    if !failures.is_empty() {
        bail!(
            "layers ({}): break an import circle or a back-arrow, or list it with a reason in \
             xtask/src/layers.rs (ALLOWED, BACK_ARROWS); place a new module in its crate's order",
            failures.join("; ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn krate(files: &[(&str, &str)]) -> (Crate, Arrows) {
        // One directory per call: the tests run in parallel.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "xtask-layers-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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

    fn back(order: Order, files: &[(&str, &str)]) -> OrderFound {
        let (k, a) = krate(files);
        let nodes: Vec<String> = k.keys().cloned().collect();
        check_order(order, &nodes, &a)
    }

    #[test]
    fn the_lists_keep_the_policy() {
        let errors = policy_errors(ALLOWED, ORDERS, BACK_ARROWS);
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn the_policy_is_checked() {
        const WHY: &str = "a reason long enough to pass";
        let circle: &[&str] = &["a", "b"];
        // No circle at all where none may be; at most two elsewhere.
        for name in NO_CIRCLES {
            let errors = policy_errors(&[(*name, circle, WHY)], &[], &[]);
            assert_eq!(errors.len(), 1, "{name}: {errors:?}");
        }
        let two = [("rrpc-kv", circle, WHY), ("rrpc-kv", &["c", "d"][..], WHY)];
        assert!(policy_errors(&two, &[], &[]).is_empty());
        let three = [two[0], two[1], ("rrpc-kv", &["e", "f"][..], WHY)];
        assert_eq!(policy_errors(&three, &[], &[]).len(), 1);
        // Each circle sorted, with a reason.
        assert_eq!(
            policy_errors(&[("rrpc-kv", &["b", "a"][..], WHY)], &[], &[]).len(),
            1
        );
        assert_eq!(policy_errors(&[("rrpc-kv", circle, "")], &[], &[]).len(), 1);
        // An order places each prefix once; a back-arrow needs an order and a reason.
        let order: Order = &[&["a"], &["b"]];
        assert!(policy_errors(&[], &[("rrpc-kv", order)], &[]).is_empty());
        let twice: Order = &[&["a"], &["b", "a"]];
        assert_eq!(policy_errors(&[], &[("rrpc-kv", twice)], &[]).len(), 1);
        let arrow = ("rrpc-kv", "a", "b", WHY);
        assert!(policy_errors(&[], &[("rrpc-kv", order)], &[arrow]).is_empty());
        assert_eq!(policy_errors(&[], &[], &[arrow]).len(), 1);
        let unexplained = ("rrpc-kv", "a", "b", "");
        assert_eq!(
            policy_errors(&[], &[("rrpc-kv", order)], &[unexplained]).len(),
            1
        );
    }

    #[test]
    fn an_arrow_to_a_later_layer_is_a_back_arrow() {
        let files = [
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            ("b.rs", "pub struct B;\n"),
        ];
        // Bottom up: b, then a, which may import b.
        assert_eq!(back(&[&["b"], &["a"]], &files), OrderFound::default());
        // a at the bottom may not.
        let found = back(&[&["a"], &["b"]], &files);
        assert_eq!(
            found.back,
            vec![("a".to_owned(), "b".to_owned(), vec!["B".to_owned()])]
        );
        assert!(found.unplaced.is_empty());
        // One layer: no order between its modules.
        assert_eq!(back(&[&["a", "b"]], &files), OrderFound::default());
    }

    #[test]
    fn a_back_arrow_passes_only_while_listed() {
        let files = [
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            ("b.rs", "pub struct B;\n"),
        ];
        let up: Order = &[&["a"], &["b"]];
        let down: Order = &[&["b"], &["a"]];
        let listed = [("k", "a", "b", "a reason long enough to pass")];
        assert_eq!(report_order("k", up, &back(up, &files), &[]).len(), 1);
        assert!(report_order("k", up, &back(up, &files), &listed).is_empty());
        // Listed, but gone: the list must be kept true.
        assert_eq!(
            report_order("k", down, &back(down, &files), &listed).len(),
            1
        );
        assert!(report_order("k", down, &back(down, &files), &[]).is_empty());
        // A module no layer places fails the order.
        let partial: Order = &[&["a"]];
        assert_eq!(
            report_order("k", partial, &back(partial, &files), &[]).len(),
            1
        );
    }

    #[test]
    fn the_longest_prefix_places_a_module_and_the_root_is_on_top() {
        let files = [
            ("lib.rs", "mod p;\npub struct R;\n"),
            ("p/mod.rs", "mod x;\nmod y;\npub struct P;\n"),
            ("p/x.rs", "pub struct X;\n"),
            (
                "p/y.rs",
                "use super::x::X;\npub fn f() -> crate::R { todo!() }\n",
            ),
        ];
        // `p::x` below `p`, which places `p::y` too: y -> x is down, y -> lib up.
        let found = back(&[&["p::x"], &["p"]], &files);
        assert_eq!(
            found.back,
            vec![("p::y".to_owned(), String::new(), vec!["R".to_owned()])]
        );
        // A module no layer places is reported, not judged.
        let found = back(&[&["p::x"], &["p::y"]], &files);
        assert_eq!(found.unplaced, vec!["p".to_owned()]);
        assert_eq!(found.back.len(), 1, "{found:?}");
        assert_eq!(layer_of(&[&["p"]], "px"), None, "a prefix ends at a `::`");
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
    fn a_bare_path_to_a_child_module_is_an_arrow() {
        // `p` names its child `c` by a bare path in code, `c` names `p`: a
        // circle. A bare path inside a `use` tree, or to no child, is none.
        let c = found(&[
            ("lib.rs", "mod p;\n"),
            ("p.rs", "mod c;\npub struct P;\npub fn f(_: c::C) {}\n"),
            ("p/c.rs", "pub struct C(crate::p::P);\n"),
        ]);
        assert_eq!(c, vec![vec!["p".to_owned(), "p::c".to_owned()]]);
        let c = found(&[
            ("lib.rs", "mod p;\nmod q;\n"),
            (
                "p.rs",
                "mod c;\nuse crate::q::{c::Q};\npub struct P;\npub fn f(_: other::c::C) {}\n",
            ),
            ("p/c.rs", "pub struct C(crate::p::P);\n"),
            ("q.rs", "pub mod c { pub struct Q; }\n"),
        ]);
        assert!(c.is_empty(), "{c:?}");
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
