//! The crate's modules depend on each other in one direction only (ARCHITECTURE.md "Layers"):
//! every `crate::<module>` path in a module's files must name a module below it in [`ORDER`],
//! except the edges in [`EXCEPTIONS`]. The test reads the sources, so a new upward `use` fails
//! here, not in review.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Every top-level module of `src/`, lowest first. A module may use the ones before it.
const ORDER: &[&str] = &[
    // Utilities that know nothing of RDMA.
    "devlog",
    "fasthash",
    "ids",
    "budget",
    "sync",
    "handoff",
    // Frames: parsing and building (wire), moving them (uplink), counting them (stats).
    "wire",
    "uplink",
    "stats",
    // The guest: its memory, rings and what the device sends it.
    "guest",
    // Objects in guest memory terms: PDs, CQs, SRQs, AHs, GIDs; MRs, MWs, ODP; QPs.
    "objects",
    "memory",
    "qp",
    // The device's tables and the rules that span them (CQE posting, QP to ERR, SRQ errors),
    // generic over the QP protocol: what the engine and the command handlers share.
    "tables",
    // The Ethernet port demux and the in-process switch.
    "port",
    "fabric",
    // The RoCEv2 engine and the device model.
    "transport",
    "device",
    // What serves them: the counters' exporter, the daemon's configuration (clap `Args` ->
    // `Config`), and the vhost-user daemon that is started with that configuration. main.rs
    // (the binary) sits above all of them.
    "exporter",
    "cli",
    "vhost_user",
];

/// Upward edges that exist today, each with the reason. Remove an entry when the edge goes
/// (`exceptions_still_exist` fails until then).
const EXCEPTIONS: &[(&str, &str, &str)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every file below `dir`, in path order.
fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("read src dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            all_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn is_rust(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "rs")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut all = Vec::new();
    all_files(dir, &mut all);
    out.extend(all.into_iter().filter(|p| is_rust(p)));
}

/// The top-level module a file of `src/` belongs to (`None` for lib.rs / main.rs).
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src()).expect("under src");
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if rel.components().count() > 1 {
        return Some(first);
    }
    let stem = first.strip_suffix(".rs")?;
    (!matches!(stem, "lib" | "main")).then(|| stem.to_string())
}

/// Drop `//` comments (doc comments included) and string literals' contents, so only code counts.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = '\0';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if in_str {
                if c == '"' && prev != '\\' {
                    in_str = false;
                    out.push('"');
                }
                prev = if prev == '\\' && c == '\\' { '\0' } else { c };
                continue;
            }
            if c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\'' {
                in_str = true;
            }
            out.push(c);
            prev = c;
        }
        out.push('\n');
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first path segment of every item `rest` names, where `rest` follows a `crate::`:
/// `device::Device` -> device; `{guest::GuestMem, qp::{Qp, QpTable}}` -> guest, qp.
fn heads(rest: &str, out: &mut BTreeSet<String>) {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        // Split the group at depth-0 commas; each part's first segment is a module.
        let mut depth = 0usize;
        let mut start = 0usize;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    push_head(&group[start..i], out);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    push_head(&group[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
    } else {
        push_head(rest, out);
    }
}

fn push_head(part: &str, out: &mut BTreeSet<String>) {
    let id = ident_at(part.trim_start());
    if !id.is_empty() && id != "self" {
        out.insert(id.to_string());
    }
}

/// The top-level modules that `code` names through `crate::` (and `$crate::` in macros).
fn used_modules(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("crate::") {
        let at = from + i;
        // `crate` must be a whole word (not e.g. `my_crate::`).
        let before = code[..at].chars().next_back();
        let whole = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if whole {
            heads(&code[at + "crate::".len()..], &mut out);
        }
        from = at + "crate::".len();
    }
    out
}

/// (from, to, file) for every cross-module path in `src/`.
fn edges() -> Vec<(String, String, String)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut v = Vec::new();
    for f in files {
        let Some(from) = module_of(&f) else { continue };
        let text = fs::read_to_string(&f).expect("read source");
        for to in used_modules(&code_only(&text)) {
            if to != from {
                let rel = f
                    .strip_prefix(src())
                    .expect("under src")
                    .display()
                    .to_string();
                v.push((from.clone(), to, rel));
            }
        }
    }
    v
}

fn rank(m: &str) -> Option<usize> {
    ORDER.iter().position(|o| *o == m)
}

fn is_exception(from: &str, to: &str) -> bool {
    EXCEPTIONS.iter().any(|(f, t, _)| *f == from && *t == to)
}

/// The edges that point up (or to an unknown module), as readable lines.
fn violations(edges: &[(String, String, String)]) -> Vec<String> {
    edges
        .iter()
        .filter(|(from, to, _)| !is_exception(from, to))
        .filter_map(|(from, to, file)| match (rank(from), rank(to)) {
            (Some(a), Some(b)) if b < a => None,
            (Some(_), Some(_)) => Some(format!("{file}: {from} -> {to} points up")),
            _ => Some(format!("{file}: {from} -> {to}: module missing from ORDER")),
        })
        .collect()
}

#[test]
fn dependencies_point_down() {
    let e = edges();
    assert!(e.len() > 20, "the scan found only {} edges", e.len());
    let bad = violations(&e);
    assert!(
        bad.is_empty(),
        "upward dependencies (see ARCHITECTURE.md \"Layers\"):\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_module_has_a_layer() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mods: BTreeSet<String> = files.iter().filter_map(|f| module_of(f)).collect();
    let missing: Vec<&String> = mods.iter().filter(|m| rank(m).is_none()).collect();
    assert!(missing.is_empty(), "modules not in ORDER: {missing:?}");
    let stale: Vec<&&str> = ORDER.iter().filter(|o| !mods.contains(**o)).collect();
    assert!(
        stale.is_empty(),
        "ORDER names modules that do not exist: {stale:?}"
    );
}

#[test]
fn exceptions_still_exist() {
    let e = edges();
    for (from, to, why) in EXCEPTIONS {
        assert!(
            e.iter().any(|(f, t, _)| f == from && t == to),
            "exception {from} -> {to} ({why}) is gone: remove it from EXCEPTIONS"
        );
        assert!(
            rank(from) < rank(to),
            "{from} -> {to} points down: no exception needed"
        );
    }
}

/// The scanner sees every form a dependency takes in this crate's code, and nothing in comments
/// or strings; an upward edge among them is reported.
#[test]
fn scanner_catches_each_form_of_a_dependency() {
    let code = code_only(
        "use crate::device::Device;\n\
         use crate::{guest::GuestMem, qp::{Qp, QpTable}};\n\
         let x = crate::transport::ctx::put_req(dev);\n\
         static L: $crate::vhost_user::LogLimit = todo!();\n\
         use crate::{\n    memory::MrTable,\n    objects::{Cq, Srq},\n};\n\
         // crate::cli::Config in a comment\n\
         let s = \"crate::exporter in a string\";\n\
         use my_crate::fabric::X;\n",
    );
    let got = used_modules(&code);
    let want: BTreeSet<String> = [
        "device",
        "guest",
        "qp",
        "transport",
        "vhost_user",
        "memory",
        "objects",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(got, want);

    // Each edge of a lower module to device/ is a violation; a downward edge is none.
    let e = vec![
        ("memory".into(), "device".into(), "memory/mr.rs".into()),
        (
            "transport".into(),
            "device".into(),
            "transport/ctx.rs".into(),
        ),
        ("device".into(), "memory".into(), "device/mod.rs".into()),
        (
            "transport".into(),
            "tables".into(),
            "transport/mod.rs".into(),
        ),
    ];
    assert_eq!(
        violations(&e),
        vec![
            "memory/mr.rs: memory -> device points up".to_string(),
            "transport/ctx.rs: transport -> device points up".to_string(),
        ]
    );
}

/// Source files allowed over [`MAX_LINES`], each with its reason (#13 item 7: "no file over
/// ~800 lines without reason").
const LONG_FILES: &[(&str, &str)] = &[(
    "wire/opcode.rs",
    "the IBTA opcode table: one row per opcode with its header mask and lengths",
)];

const MAX_LINES: usize = 800;

#[test]
fn no_file_is_long_without_a_reason() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let root = src();
    let mut long = Vec::new();
    for f in &files {
        let lines = fs::read_to_string(f).expect("read source").lines().count();
        let rel = f
            .strip_prefix(&root)
            .expect("under src")
            .to_string_lossy()
            .into_owned();
        if lines > MAX_LINES && !LONG_FILES.iter().any(|(p, _)| *p == rel) {
            long.push(format!("{rel}: {lines} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "split these files or give the reason in LONG_FILES: {long:?}"
    );
    for (p, _) in LONG_FILES {
        let n = fs::read_to_string(root.join(p))
            .map(|t| t.lines().count())
            .unwrap_or(0);
        assert!(
            n > MAX_LINES,
            "{p} is {n} lines now: remove it from LONG_FILES"
        );
    }
}

/// Everything under `src/` is Rust source: a `.orig`/`.rej` left by a patch or an editor's
/// backup is never built, so nothing else would notice it was committed (one was, in the
/// `tables/` split).
#[test]
fn src_holds_only_rust_sources() {
    let mut files = Vec::new();
    all_files(&src(), &mut files);
    let stray: Vec<_> = files.iter().filter(|p| !is_rust(p)).collect();
    assert!(stray.is_empty(), "not Rust sources under src/: {stray:?}");
}
