//! ABI agreement: `include/vrdma_abi.h` (C) versus the `vrdma-spec` crate (Rust).
//!
//! The test parses the header for every `struct vrdma_*` (every field, union members included),
//! every object-like `#define` and every function-like macro, generates a C program that prints
//! `sizeof`/`_Alignof`/`offsetof`/field sizes, the constant values and the macro results for
//! sample inputs, compiles it with the system C compiler (`$CC`, else `cc`, else `gcc`; no
//! compiler is a test failure) and compares its output line by line with the same dump produced
//! from the Rust tables (`ABI_STRUCTS`, `ABI_CONSTANTS`, the key helpers). Because the C program
//! is generated from the header, a field or constant added to the header cannot be skipped: it
//! shows up as "missing on the Rust side".
//!
//! The negative tests feed a modified copy of the header (a moved field, a changed constant, an
//! added field and constant) and a modified Rust dump, and assert that each difference is reported.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use vrdma_spec::{ABI_CONSTANTS, ABI_STRUCTS};

// ------------------------------------------------------------------------------------------
// Header parsing
// ------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Header {
    /// (struct name without `struct`, field paths such as `wr` and `wr.rdma`)
    structs: Vec<(String, Vec<String>)>,
    /// Object-like macros with a value.
    consts: Vec<String>,
    /// Function-like macros (name only).
    fn_macros: Vec<String>,
}

fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    loop {
        let block = rest.find("/*");
        let line = rest.find("//");
        // A line comment wins only if it starts before the next block comment.
        let line = line.filter(|&l| !matches!(block, Some(b) if b < l));
        match (block, line) {
            (Some(b), None) => {
                out.push_str(&rest[..b]);
                match rest[b + 2..].find("*/") {
                    Some(e) => {
                        out.push(' ');
                        rest = &rest[b + 2 + e + 2..];
                    }
                    None => panic!("unterminated comment in header"),
                }
            }
            (_, Some(l)) => {
                out.push_str(&rest[..l]);
                rest = match rest[l..].find('\n') {
                    Some(e) => &rest[l + e..],
                    None => "",
                };
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

fn tokenize(src: &str) -> Vec<String> {
    let mut toks = Vec::new();
    let mut cur = String::new();
    for ch in src.chars() {
        if ch.is_ascii_alphanumeric() || ch == '_' {
            cur.push(ch);
            continue;
        }
        if !cur.is_empty() {
            toks.push(std::mem::take(&mut cur));
        }
        if !ch.is_whitespace() {
            toks.push(ch.to_string());
        }
    }
    if !cur.is_empty() {
        toks.push(cur);
    }
    toks
}

/// Index of the `}` matching the `{` at `open`.
fn matching_brace(toks: &[String], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, t) in toks.iter().enumerate().skip(open) {
        match t.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced braces in header");
}

/// Declarator names of one declaration (`__u8 a[6], b` -> a, b).
fn declarator_names(decl: &[String]) -> Vec<String> {
    let mut names = Vec::new();
    for part in decl.split(|t| t == ",") {
        let mut depth = 0;
        let mut last = None;
        for t in part {
            match t.as_str() {
                "[" => depth += 1,
                "]" => depth -= 1,
                t if depth == 0 && is_ident(t) => last = Some(t.to_string()),
                _ => {}
            }
        }
        names.push(last.expect("declaration without a name"));
    }
    names
}

/// Field paths of a struct/union body `toks` (without the braces).
fn parse_members(toks: &[String], prefix: &str, out: &mut Vec<String>) {
    let mut i = 0;
    while i < toks.len() {
        let start = i;
        if let Some(open) = toks[i..]
            .iter()
            .position(|t| t == "{" || t == ";")
            .map(|p| p + i)
            .filter(|&p| toks[p] == "{")
        {
            // Inline struct/union: `union { ... } name;`
            let close = matching_brace(toks, open);
            let end = toks[close..]
                .iter()
                .position(|t| t == ";")
                .map(|p| p + close)
                .expect("missing ';' after inline union");
            for name in declarator_names(&toks[close + 1..end]) {
                let path = format!("{prefix}{name}");
                out.push(path.clone());
                parse_members(&toks[open + 1..close], &format!("{path}."), out);
            }
            i = end + 1;
        } else {
            let end = toks[start..]
                .iter()
                .position(|t| t == ";")
                .map(|p| p + start)
                .expect("missing ';' in struct");
            for name in declarator_names(&toks[start..end]) {
                out.push(format!("{prefix}{name}"));
            }
            i = end + 1;
        }
    }
}

fn parse_header(src: &str) -> Header {
    let src = strip_comments(src);
    let mut h = Header::default();
    let mut code = String::new();
    for line in src.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix('#') {
            let rest = rest.trim_start();
            if let Some(def) = rest.strip_prefix("define") {
                let def = def.trim_start();
                let name: String = def
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let after = &def[name.len()..];
                if after.starts_with('(') {
                    h.fn_macros.push(name);
                } else if !after.trim().is_empty() {
                    h.consts.push(name);
                }
            }
            continue;
        }
        code.push_str(line);
        code.push('\n');
    }
    let toks = tokenize(&code);
    let mut i = 0;
    while i + 2 < toks.len() {
        if toks[i] == "struct" && is_ident(&toks[i + 1]) && toks[i + 2] == "{" {
            let close = matching_brace(&toks, i + 2);
            let mut fields = Vec::new();
            parse_members(&toks[i + 3..close], "", &mut fields);
            h.structs.push((toks[i + 1].clone(), fields));
            i = close + 1;
        } else {
            i += 1;
        }
    }
    h
}

// ------------------------------------------------------------------------------------------
// Dumps
// ------------------------------------------------------------------------------------------

/// Sample inputs for function-like macros.
const MACRO_SAMPLES: &[u32] = &[0, 1, 0xff, 0x100, 0x1234_5678, 0xffff_ffff];

/// The Rust mirror of each function-like macro of the header.
fn rust_macro(name: &str) -> Option<fn(u32) -> u64> {
    match name {
        "VRDMA_KEY_INDEX" => Some(|k| u64::from(vrdma_spec::vrdma_key_index(k))),
        "VRDMA_KEY_VARIANT" => Some(|k| u64::from(vrdma_spec::vrdma_key_variant(k))),
        _ => None,
    }
}

fn generate_c(header: &Path, h: &Header) -> String {
    let mut c = String::new();
    writeln!(c, "#include <stdio.h>\n#include <stddef.h>").unwrap();
    writeln!(c, "#include \"{}\"\n", header.display()).unwrap();
    writeln!(c, "int main(void)\n{{").unwrap();
    for (s, fields) in &h.structs {
        writeln!(
            c,
            "\tprintf(\"struct {s} %zu %zu\\n\", sizeof(struct {s}), _Alignof(struct {s}));"
        )
        .unwrap();
        for f in fields {
            writeln!(
                c,
                "\tprintf(\"field {s}.{f} %zu %zu\\n\", offsetof(struct {s}, {f}), \
                 sizeof(((struct {s} *)0)->{f}));"
            )
            .unwrap();
        }
    }
    for k in &h.consts {
        writeln!(
            c,
            "\tprintf(\"const {k} %llu\\n\", (unsigned long long)({k}));"
        )
        .unwrap();
    }
    for m in &h.fn_macros {
        for v in MACRO_SAMPLES {
            writeln!(
                c,
                "\tprintf(\"macro {m}({v:#x}) %llu\\n\", (unsigned long long)({m}({v:#x}U)));"
            )
            .unwrap();
        }
    }
    writeln!(c, "\treturn 0;\n}}").unwrap();
    c
}

fn rust_dump(fn_macros: &[String]) -> String {
    let mut d = String::new();
    for s in ABI_STRUCTS {
        writeln!(d, "struct {} {} {}", s.c_name, s.size, s.align).unwrap();
        for f in s.fields {
            writeln!(d, "field {}.{} {} {}", s.c_name, f.name, f.offset, f.size).unwrap();
        }
    }
    for (name, value) in ABI_CONSTANTS {
        writeln!(d, "const {name} {value}").unwrap();
    }
    for m in fn_macros {
        if let Some(f) = rust_macro(m) {
            for v in MACRO_SAMPLES {
                writeln!(d, "macro {m}({v:#x}) {}", f(*v)).unwrap();
            }
        }
    }
    d
}

fn compiler() -> String {
    if let Ok(cc) = std::env::var("CC") {
        if !cc.trim().is_empty() {
            return cc;
        }
    }
    for cc in ["cc", "gcc", "clang"] {
        if Command::new(cc).arg("--version").output().is_ok() {
            return cc.to_string();
        }
    }
    panic!(
        "ABI agreement test: no C compiler found ($CC, cc, gcc, clang); install gcc \
         (apt-get install gcc) — this test must not be skipped"
    );
}

fn tmp_dir(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("abi-agreement-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// Generates, compiles and runs the C dump program for the header at `header`.
fn c_dump(header: &Path, tag: &str) -> (Header, String) {
    let text = std::fs::read_to_string(header).expect("read header");
    let h = parse_header(&text);
    let dir = tmp_dir(tag);
    let src = dir.join("abi_dump.c");
    let bin = dir.join("abi_dump");
    std::fs::write(&src, generate_c(header, &h)).expect("write abi_dump.c");
    let cc = compiler();
    let out = Command::new(&cc)
        .args([
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Wpadded",
            "-Werror",
            "-o",
        ])
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        out.status.success(),
        "{cc} failed on {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&bin).output().expect("run abi_dump");
    assert!(run.status.success(), "abi_dump failed");
    // Keep the generated program for inspection only when asked to.
    if std::env::var_os("VRDMA_ABI_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    (h, String::from_utf8(run.stdout).expect("utf-8 output"))
}

/// Compares two dumps; returns one human-readable line per difference.
fn compare(c: &str, rust: &str) -> Vec<String> {
    fn parse(d: &str) -> BTreeMap<String, String> {
        d.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let mut it = l.splitn(3, ' ');
                let kind = it.next().unwrap_or("");
                let name = it.next().unwrap_or("");
                let val = it.next().unwrap_or("").to_string();
                (format!("{kind} {name}"), val)
            })
            .collect()
    }
    let c = parse(c);
    let r = parse(rust);
    let mut diffs = Vec::new();
    for (k, cv) in &c {
        match r.get(k) {
            None => diffs.push(format!("{k}: in the C header, missing on the Rust side")),
            Some(rv) if rv != cv => diffs.push(format!("{k}: C says `{cv}`, Rust says `{rv}`")),
            Some(_) => {}
        }
    }
    for k in r.keys() {
        if !c.contains_key(k) {
            diffs.push(format!("{k}: on the Rust side, not in the C header"));
        }
    }
    diffs
}

fn header_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include/vrdma_abi.h")
}

fn camel(c_name: &str) -> String {
    c_name
        .split('_')
        .map(|w| {
            let mut ch = w.chars();
            match ch.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + ch.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

// ------------------------------------------------------------------------------------------
// Tests
// ------------------------------------------------------------------------------------------

#[test]
fn abi_agrees_with_c_header() {
    let (h, c) = c_dump(&header_path(), "real");
    let rust = rust_dump(&h.fn_macros);
    let diffs = compare(&c, &rust);
    assert!(
        diffs.is_empty(),
        "C header and Rust mirror disagree ({} differences):\n  {}",
        diffs.len(),
        diffs.join("\n  ")
    );
    let fields: usize = h.structs.iter().map(|s| s.1.len()).sum();
    // Guard against a parser that silently finds nothing.
    assert_eq!(h.structs.len(), ABI_STRUCTS.len());
    assert_eq!(
        fields,
        ABI_STRUCTS.iter().map(|s| s.fields.len()).sum::<usize>()
    );
    assert_eq!(h.consts.len(), ABI_CONSTANTS.len());
    assert!(h.structs.len() >= 34 && fields >= 230 && h.consts.len() >= 190);
    assert_eq!(h.fn_macros.len(), 2);
    println!(
        "ABI agreement: {} structs, {} fields, {} constants, {} macros x {} samples: C and Rust agree",
        h.structs.len(),
        fields,
        h.consts.len(),
        h.fn_macros.len(),
        MACRO_SAMPLES.len()
    );
}

#[test]
fn every_header_name_is_mirrored() {
    let text = std::fs::read_to_string(header_path()).expect("read header");
    let h = parse_header(&text);
    for (s, _) in &h.structs {
        let r = ABI_STRUCTS
            .iter()
            .find(|r| r.c_name == s.as_str())
            .unwrap_or_else(|| panic!("struct {s} has no Rust mirror"));
        assert_eq!(r.rust_name, camel(s), "Rust name of struct {s}");
    }
    for k in &h.consts {
        assert!(
            ABI_CONSTANTS.iter().any(|(n, _)| n == k),
            "constant {k} has no Rust mirror"
        );
    }
    for m in &h.fn_macros {
        assert!(rust_macro(m).is_some(), "macro {m} has no Rust mirror");
    }
    let header_consts: Vec<_> = h.consts.iter().map(String::as_str).collect();
    for (n, _) in ABI_CONSTANTS {
        assert!(
            header_consts.contains(n),
            "Rust constant {n} not in the header"
        );
    }
}

#[test]
fn parser_sees_unions_arrays_and_macros() {
    let h = parse_header(
        "/* c */ #define A 1 /* x */\n#define F(x) ((x) + 1)\n#ifndef G\n#define G\n#endif\n\
         struct s { __u8 a[6]; // tail\n __le16 b, c; union { struct t x; __u8 raw[8]; } u; };",
    );
    assert_eq!(h.consts, vec!["A"]);
    assert_eq!(h.fn_macros, vec!["F"]);
    assert_eq!(
        h.structs,
        vec![(
            "s".to_string(),
            vec!["a", "b", "c", "u", "u.x", "u.raw"]
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>()
        )]
    );
}

/// A header whose layout and constants differ from the Rust side must be reported, entry by entry.
#[test]
fn detects_mismatches_in_a_modified_header() {
    let text = std::fs::read_to_string(header_path()).expect("read header");
    let dir = tmp_dir("modified");
    let hdr = dir.join("vrdma_abi_modified.h");

    // 1. Move a field: status before opcode in vrdma_cqe.
    let moved = text.replacen(
        "\t__u8\topcode;\t\t\t/* VRDMA_WC_* */\n\t__u8\tstatus;",
        "\t__u8\tstatus;\n\t__u8\topcode;\t\t\t/* VRDMA_WC_* */",
        1,
    );
    assert_ne!(moved, text, "test setup: the cqe field swap did not apply");
    // 2. Change a constant.
    let changed = moved.replacen("VRDMA_WR_SEND\t\t\t2", "VRDMA_WR_SEND\t\t\t12", 1);
    assert_ne!(
        changed, moved,
        "test setup: the constant change did not apply"
    );
    // 3. Add a field (into reserved space) and a constant.
    let added = changed
        .replacen(
            "struct vrdma_event {\n\t__le32\ttype;",
            "struct vrdma_event {\n\t__le32\ttype;\n\t__le32\tnew_field;",
            1,
        )
        .replacen(
            "#define VRDMA_GSI_QPN",
            "#define VRDMA_NEW_CONST\t\t7\n#define VRDMA_GSI_QPN",
            1,
        );
    assert_ne!(added, changed, "test setup: the additions did not apply");
    std::fs::write(&hdr, &added).expect("write modified header");

    let (h, c) = c_dump(&hdr, "modified");
    let diffs = compare(&c, &rust_dump(&h.fn_macros));
    let has = |needle: &str| diffs.iter().any(|d| d.starts_with(needle));
    assert!(has("field vrdma_cqe.opcode: C says `13 1`"), "{diffs:#?}");
    assert!(has("field vrdma_cqe.status: C says `12 1`"), "{diffs:#?}");
    assert!(has("const VRDMA_WR_SEND: C says `12`"), "{diffs:#?}");
    assert!(
        has("field vrdma_event.new_field: in the C header, missing on the Rust side"),
        "{diffs:#?}"
    );
    assert!(has("struct vrdma_event: C says `20 4`"), "{diffs:#?}");
    assert!(
        has("const VRDMA_NEW_CONST: in the C header, missing on the Rust side"),
        "{diffs:#?}"
    );
    // Fields after the inserted one moved too.
    assert!(has("field vrdma_event.id: C says `8 4`"), "{diffs:#?}");
}

/// A wrong Rust-side entry (offset, size, constant, missing struct) must be reported too.
#[test]
fn detects_mismatches_on_the_rust_side() {
    let (h, c) = c_dump(&header_path(), "rust-side");
    let good = rust_dump(&h.fn_macros);
    assert!(compare(&c, &good).is_empty());

    let bad = good
        .replacen(
            "field vrdma_send_wqe.wr.rdma 24 16",
            "field vrdma_send_wqe.wr.rdma 32 16",
            1,
        )
        .replacen("const VRDMA_STATUS_BUSY 5", "const VRDMA_STATUS_BUSY 6", 1)
        .replacen("struct vrdma_handle 8 4\n", "", 1)
        .replacen(
            "macro VRDMA_KEY_VARIANT(0x100) 0",
            "macro VRDMA_KEY_VARIANT(0x100) 1",
            1,
        );
    let diffs = compare(&c, &bad);
    let has = |needle: &str| diffs.iter().any(|d| d.starts_with(needle));
    assert!(has(
        "field vrdma_send_wqe.wr.rdma: C says `24 16`, Rust says `32 16`"
    ));
    assert!(has("const VRDMA_STATUS_BUSY: C says `5`, Rust says `6`"));
    assert!(has(
        "struct vrdma_handle: in the C header, missing on the Rust side"
    ));
    assert!(has(
        "macro VRDMA_KEY_VARIANT(0x100): C says `0`, Rust says `1`"
    ));
    assert_eq!(diffs.len(), 4, "{diffs:#?}");

    let extra = format!("{good}const VRDMA_RUST_ONLY 3\n");
    assert_eq!(
        compare(&c, &extra),
        vec!["const VRDMA_RUST_ONLY: on the Rust side, not in the C header".to_string()]
    );
}

// ------------------------------------------------------------------------------------------
// The normative text (virtio-rdma.md) against the ABI
// ------------------------------------------------------------------------------------------

fn spec_text() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("virtio-rdma.md"))
        .expect("read virtio-rdma.md")
}

/// `(struct name, stated size, rows of (field, offset, size))` of every "### struct" table.
type SpecTable = (String, usize, Vec<(String, usize, usize)>);

fn spec_tables(md: &str) -> Vec<SpecTable> {
    let mut out: Vec<SpecTable> = Vec::new();
    for line in md.lines() {
        if let Some(rest) = line.strip_prefix("### struct ") {
            let (name, size) = rest
                .split_once(" (")
                .unwrap_or_else(|| panic!("bad struct heading: {line}"));
            let size = size
                .trim_end_matches(" bytes)")
                .parse()
                .unwrap_or_else(|_| panic!("bad size in: {line}"));
            out.push((name.to_string(), size, Vec::new()));
        } else if line.starts_with("## ") {
            // A new top-level section ends the last table's scope.
            if let Some(last) = out.last() {
                if !last.2.is_empty() {
                    out.push((String::new(), 0, Vec::new()));
                }
            }
        } else if let Some(cur) = out.last_mut() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // | offset | size | type | `field` | notes |
            if cells.len() >= 6 && cells[4].starts_with('`') {
                let off = cells[1].parse().expect("offset");
                let size = cells[2].parse().expect("size");
                cur.2
                    .push((cells[4].trim_matches('`').to_string(), off, size));
            }
        }
    }
    out.retain(|t| !t.0.is_empty());
    out
}

#[test]
fn spec_layout_tables_match_the_abi() {
    let tables = spec_tables(&spec_text());
    assert_eq!(
        tables.len(),
        ABI_STRUCTS.len(),
        "virtio-rdma.md Appendix A must have one table per ABI struct"
    );
    for s in ABI_STRUCTS {
        let t = tables
            .iter()
            .find(|t| t.0 == s.c_name)
            .unwrap_or_else(|| panic!("virtio-rdma.md has no table for struct {}", s.c_name));
        assert_eq!(t.1, s.size, "stated size of struct {}", s.c_name);
        let want: Vec<(String, usize, usize)> = s
            .fields
            .iter()
            .map(|f| (f.name.to_string(), f.offset, f.size))
            .collect();
        assert_eq!(t.2, want, "rows of the struct {} table", s.c_name);
    }
}

/// Every "§N" / "§N.M" cited by the header, DESIGN.md and the Rust mirror is a section of the spec.
#[test]
fn cited_sections_exist_in_the_spec() {
    let md = spec_text();
    let headings: Vec<String> = md
        .lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| l.split_once('§').map(|(_, r)| r.to_string()))
        .filter_map(|r| r.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(headings.len() >= 16, "spec headings not found");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for file in ["include/vrdma_abi.h", "DESIGN.md", "src/lib.rs"] {
        let text = std::fs::read_to_string(dir.join(file)).expect("read cited file");
        for (_, rest) in text
            .match_indices('§')
            .map(|(i, _)| text.split_at(i + '§'.len_utf8()))
        {
            let num: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let num = num.trim_end_matches('.');
            if num.is_empty() {
                continue;
            }
            assert!(
                headings.iter().any(|h| h == num),
                "{file} cites §{num}, which virtio-rdma.md does not have"
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "too few citations found ({checked})");
}
