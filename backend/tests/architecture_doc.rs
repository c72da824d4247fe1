//! `backend/ARCHITECTURE.md` names only what exists (its conventions are stated at its top):
//! - every backticked path exists: relative to `backend/src/`, or to the repository for one
//!   starting with `backend/` or `device-spec/`, or to `backend/` for `tests/` and `benches/`;
//! - every backticked Rust name that is CamelCase, SCREAMING_SNAKE, contains `::` or ends in
//!   `()` is defined in the module its path names (a file or directory of `src/`), or anywhere
//!   in `src/` when it names no module; names of other crates (`std::…`, `vm_memory::…`) are
//!   not checked;
//! - every `§N` / `§N.M` cited is a heading of `device-spec/virtio-rdma.md`;
//! - every directory of `src/` has a line in the module map.
//!
//! Renaming or moving a file, type or function the document names fails here until the
//! document follows.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Crates whose names the document may use; not looked up in `src/`.
const OTHER_CRATES: &[&str] = &[
    "std",
    "core",
    "alloc",
    "vm_memory",
    "vhost",
    "vhost_user_backend",
    "virtio_queue",
    "vmm_sys_util",
    "vrdma_spec",
    "libc",
    "loom",
    "log",
    "clap",
    "thiserror",
];

/// What an item definition starts with (after any `pub`/`pub(crate)` and qualifiers).
const DEFINERS: &[&str] = &[
    "fn",
    "struct",
    "enum",
    "trait",
    "type",
    "const",
    "static",
    "mod",
    "union",
    "macro_rules!",
];

fn backend() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn src() -> PathBuf {
    backend().join("src")
}

fn repo() -> PathBuf {
    backend()
        .parent()
        .expect("backend/ has a parent")
        .to_path_buf()
}

/// Every file below `dir` (sorted), and every directory below it (sorted, `dir` excluded).
fn walk(dir: &Path, files: &mut Vec<PathBuf>, dirs: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            dirs.push(p.clone());
            walk(&p, files, dirs);
        } else if p.extension().is_some_and(|e| e == "rs") {
            files.push(p);
        }
    }
}

/// The `.rs` sources of a module: its file, or its directory's files (submodules included).
struct Sources {
    /// (path, text) of every `.rs` file of `src/`.
    files: Vec<(PathBuf, String)>,
}

impl Sources {
    fn load() -> Sources {
        let (mut paths, mut dirs) = (Vec::new(), Vec::new());
        walk(&src(), &mut paths, &mut dirs);
        let files = paths
            .into_iter()
            .map(|p| {
                let text = fs::read_to_string(&p).expect("read source");
                (p, text)
            })
            .collect();
        Sources { files }
    }

    /// Is `name` defined in a file under `scope` (a file or a directory of `src/`)?
    fn defines(&self, scope: &Path, name: &str) -> bool {
        self.files
            .iter()
            .filter(|(p, _)| p == scope || p.starts_with(scope))
            .any(|(_, text)| text.lines().any(|l| defines_on_line(l, name)))
    }
}

/// Whether `line` defines `name`: an item (`fn name`, `struct name`, …), or a variant or a
/// field (the line starts with `name` followed by `(`, `{`, `,`, `:` or its end).
fn defines_on_line(line: &str, name: &str) -> bool {
    let words: Vec<&str> = line
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '!'))
        .filter(|w| !w.is_empty())
        .collect();
    if words
        .windows(2)
        .any(|w| DEFINERS.contains(&w[0]) && w[1] == name)
    {
        return true;
    }
    let mut rest = line.trim_start();
    for vis in ["pub(crate) ", "pub(super) ", "pub "] {
        if let Some(r) = rest.strip_prefix(vis) {
            rest = r;
            break;
        }
    }
    rest.strip_prefix(name).is_some_and(|after| {
        let after = after.trim_start();
        after.is_empty() || after.starts_with(['(', '{', ',', ':']) && !after.starts_with("::")
    })
}

/// The backticked spans of `doc` outside fenced code blocks, each with the directory of the
/// list item it is in (the item's first span when that is a directory, `fabric/`): a file
/// name there may be relative to it.
fn backticked(doc: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut item_dir: Option<String> = None;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let spans: Vec<&str> = line.split('`').skip(1).step_by(2).collect();
        // `split` yields an unclosed span's text last: drop it.
        let spans = &spans[..line.matches('`').count() / 2];
        if line.starts_with("- ") {
            item_dir = spans
                .first()
                .filter(|s| line.starts_with(&format!("- `{s}`")) && s.ends_with('/'))
                .map(|s| s.to_string());
        } else if !line.starts_with("  ") {
            item_dir = None;
        }
        out.extend(spans.iter().map(|s| (s.to_string(), item_dir.clone())));
    }
    out
}

fn is_path(s: &str) -> bool {
    (s.contains('/') || s.ends_with(".rs"))
        && !s.contains("::")
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
}

/// Where a path of the document is (`item_dir`: see [`backticked`]).
fn resolve_path(s: &str, item_dir: Option<&str>) -> PathBuf {
    let plain = if s.starts_with("backend/") || s.starts_with("device-spec/") {
        repo().join(s)
    } else if s.starts_with("tests/") || s.starts_with("benches/") {
        backend().join(s)
    } else {
        src().join(s)
    };
    match item_dir {
        Some(dir) if !plain.exists() => src().join(dir).join(s),
        _ => plain,
    }
}

/// The Rust name in `s` if the document marks it as code to check: `a::b::C`, `f()`,
/// `CamelCase`, `SCREAMING_SNAKE` (generic arguments dropped).
fn rust_name(s: &str) -> Option<Vec<String>> {
    let s = s.strip_suffix("()").unwrap_or(s);
    let s = s.split('<').next().unwrap_or(s);
    let segments: Vec<&str> = s.split("::").collect();
    let ident = |w: &str| {
        w.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if !segments.iter().all(|w| ident(w)) {
        return None;
    }
    let one = segments[0];
    let camel = one.starts_with(|c: char| c.is_ascii_uppercase())
        && one.chars().any(|c| c.is_ascii_lowercase());
    let screaming = one.contains('_') && !one.chars().any(|c| c.is_ascii_lowercase());
    let marked = segments.len() > 1 || camel || screaming;
    (marked && !OTHER_CRATES.contains(&one))
        .then(|| segments.iter().map(|w| w.to_string()).collect())
}

/// Where `segments` is defined: the longest module prefix as a file and/or directory of
/// `src/` (`a.rs` and `a/`, or `a/mod.rs`), then the remaining names, each of which must be
/// defined in that module (anywhere in `src/` when the path names no module). `None` if it
/// is; else what is missing.
fn check_name(sources: &Sources, segments: &[String]) -> Option<String> {
    let mut scope = vec![src()];
    let mut rest = segments;
    if rest.first().is_some_and(|s| s == "crate") {
        rest = &rest[1..];
    }
    while let Some((first, tail)) = rest.split_first() {
        if tail.is_empty() {
            break;
        }
        let inner: Vec<PathBuf> = scope
            .iter()
            .filter(|s| s.is_dir())
            .flat_map(|s| [s.join(format!("{first}.rs")), s.join(first)])
            .filter(|p| p.exists())
            .collect();
        if inner.is_empty() {
            break;
        }
        scope = inner;
        rest = tail;
    }
    rest.iter()
        .find(|name| !scope.iter().any(|s| sources.defines(s, name)))
        .map(|name| {
            let scope: Vec<String> = scope.iter().map(|s| s.display().to_string()).collect();
            format!(
                "`{}`: no definition of `{name}` in {}",
                segments.join("::"),
                scope.join(" or ")
            )
        })
}

/// The spec's section numbers (`§2`, `§2.5`, …) from its headings.
fn spec_sections() -> BTreeSet<String> {
    let spec = fs::read_to_string(repo().join("device-spec/virtio-rdma.md")).expect("read spec");
    spec.lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('§')))
        .map(str::to_string)
        .collect()
}

/// Every `§N` / `§N.M` of `doc`.
fn cited_sections(doc: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in doc.match_indices('§') {
        let tail = &doc[i + '§'.len_utf8()..];
        let n: String = tail
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let n = n.trim_end_matches('.');
        if !n.is_empty() {
            out.insert(format!("§{n}"));
        }
    }
    out
}

/// Everything the document names that does not exist, one line each.
fn problems(doc: &str, sources: &Sources, spec: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (span, item_dir) in backticked(doc) {
        if !seen.insert((span.clone(), item_dir.clone())) {
            continue;
        }
        if is_path(&span) {
            let path = resolve_path(&span, item_dir.as_deref());
            if !path.exists() {
                out.push(format!(
                    "`{span}`: no such file or directory ({})",
                    path.display()
                ));
            }
        } else if let Some(segments) = rust_name(&span) {
            out.extend(check_name(sources, &segments));
        }
    }
    out.extend(
        cited_sections(doc)
            .into_iter()
            .filter(|s| !spec.contains(s))
            .map(|s| format!("{s}: not a heading of device-spec/virtio-rdma.md")),
    );
    out
}

fn document() -> String {
    fs::read_to_string(backend().join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md")
}

#[test]
fn every_path_name_and_section_the_document_names_exists() {
    let problems = problems(&document(), &Sources::load(), &spec_sections());
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md names what does not exist:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_directory_of_src_is_in_the_module_map() {
    let doc = document();
    let named: BTreeSet<String> = backticked(&doc).into_iter().map(|(s, _)| s).collect();
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    walk(&src(), &mut files, &mut dirs);
    let missing: Vec<String> = dirs
        .iter()
        .map(|d| {
            let rel = d.strip_prefix(src()).expect("under src");
            format!("{}/", rel.display())
        })
        .filter(|d| !named.contains(d))
        .collect();
    assert!(
        missing.is_empty(),
        "directories of backend/src without a line in ARCHITECTURE.md's module map: {missing:?}"
    );
}

/// The check itself: wrong paths, names and sections are reported, right ones are not.
#[test]
fn the_check_reports_what_does_not_exist() {
    let doc = "\
`transport/engine/worker.rs`, `transport/no_such_file.rs`, `tests/layering.rs`, `tests/nothing.rs`\n\
`transport::ctx::post_cqe`, `transport::ctx::no_such_fn`, `DeviceTables::post_cqe`,\n\
`NoSuchType`, `qp::worker_of`, `qp::NoSuchThing`, `HandoffLock`, `std::sync::Nothing`,\n\
`--poll-us`, `taken`, `NO_SUCH_CONST`, `MAX_WORKERS`, §16.1, §2.5, §99.9\n\
- `transport/responder/` — `checks.rs`, `nothing.rs`\n  `execute.rs`\n\
Outside the item: `checks.rs`\n\
```\n`InsideAFence`\n```\n";
    let found = problems(doc, &Sources::load(), &spec_sections());
    let names: Vec<&str> = found
        .iter()
        .map(|p| p.split(": ").next().unwrap_or(p))
        .collect();
    assert_eq!(
        names,
        [
            "`transport/no_such_file.rs`",
            "`tests/nothing.rs`",
            "`transport::ctx::no_such_fn`",
            "`NoSuchType`",
            "`qp::NoSuchThing`",
            "`NO_SUCH_CONST`",
            "`nothing.rs`",
            "`checks.rs`",
            "§99.9",
        ],
        "{found:#?}"
    );
}
