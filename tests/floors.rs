//! The floors of DESIGN.md, kept: every top-level module of `src/` stands
//! on a floor, and may import only modules of a lower one (the ground
//! helpers import nothing of ours but `sync`, the floor below them). The test reads the sources (no binary,
//! no build of ours needed beyond this file), finds each module's
//! references to the others (`crate::x`, `use crate::{x, y}` groups, and
//! `super::super::…` chains that climb out of a top-level folder), and
//! fails naming the file and line of each import that points sideways or
//! up. On success it prints the import table it found (`--nocapture`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors, bottom up.
const FLOORS: &[(&str, u8)] = &[
    // Below the ground: extensions of std that every module may use.
    ("sync", 0),
    // The ground: helpers that know nothing of the rest.
    ("host", 1),
    ("quantity", 1),
    ("duration", 1),
    ("decode", 1),
    ("backoff", 1),
    ("metrics", 1),
    ("websocket", 1),
    ("net", 1),
    ("well_known", 1),
    ("quota", 2),
    ("store", 2),
    ("pki", 2),
    ("client", 3),
    // Components: they talk to each other through the API only.
    ("apiserver", 4),
    ("controllers", 4),
    ("scheduler", 4),
    ("network", 4),
    ("agent", 5),
    ("cli", 6),
];

/// Edges the floors would allow but DESIGN.md does not: the node role
/// reaches the API server and the controllers through the API, never by
/// importing them. (Its admission reuses the scheduler's filters, as
/// upstream's kubelet does, and it runs the network's parts.)
const THROUGH_THE_API: &[(&str, &str)] = &[("agent", "apiserver"), ("agent", "controllers")];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level modules: `src/<m>.rs` and `src/<m>/`, without the crate roots.
fn top_level_modules() -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(src()).expect("src/ is readable") {
        let path = entry.expect("src/ is readable").path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if path.is_dir() {
            modules.insert(name.to_string());
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" && stem != "main" {
                modules.insert(stem.to_string());
            }
        }
    }
    modules
}

/// The `.rs` files of a module, each with its depth below the crate root
/// (`src/m/mod.rs` is 1, `src/m/x.rs` 2, `src/m/a/b.rs` 3).
fn files_of(module: &str) -> Vec<(PathBuf, usize)> {
    let single = src().join(format!("{module}.rs"));
    if single.is_file() {
        return vec![(single, 1)];
    }
    let mut out = Vec::new();
    let mut stack = vec![src().join(module)];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("module folder is readable") {
            let path = entry.expect("module folder is readable").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(src()).expect("under src/");
                let parts = rel.components().count();
                let depth = if path.file_name().is_some_and(|n| n == "mod.rs") { parts - 1 } else { parts };
                out.push((path, depth));
            }
        }
    }
    out.sort();
    out
}

/// The code of a line: nothing of a comment-only line, and what stands
/// before a trailing `// …` comment.
fn code_of(line: &str) -> &str {
    let trimmed = line.trim_start();
    if trimmed.starts_with("//") {
        return "";
    }
    match line.find(" //") {
        Some(i) => &line[..i],
        None => line,
    }
}

fn identifier_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The first segments of the paths in a `{a, b::c, d as e}` group that
/// starts at `group` (just after its `{`); the group may go on over
/// several lines (`rest`).
fn group_heads(group: &str, rest: &mut dyn Iterator<Item = &str>) -> Vec<String> {
    let mut text = group.to_string();
    let mut level = 1 + text.matches('{').count() as i32 - text.matches('}').count() as i32;
    while level > 0 {
        let Some(next) = rest.next() else { break };
        let next = code_of(next);
        level += next.matches('{').count() as i32 - next.matches('}').count() as i32;
        text.push(' ');
        text.push_str(next);
    }
    // Only the outermost level's items: drop nested groups.
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item = String::new();
    for c in text.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(identifier_at(item.trim()).to_string());
                item.clear();
            }
            _ if depth == 0 => item.push(c),
            _ => {}
        }
    }
    heads.push(identifier_at(item.trim()).to_string());
    heads.retain(|h| !h.is_empty());
    heads
}

/// One reference of a module to another: where, and to what.
struct Reference {
    file: PathBuf,
    line: usize,
    target: String,
}

/// The top-level modules a file names, with their lines.
fn references_in(file: &Path, depth: usize, modules: &BTreeSet<String>) -> Vec<Reference> {
    let text = std::fs::read_to_string(file).expect("source is readable");
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    // Inline modules (`mod tests {`) open a level below the file's own,
    // which `super` climbs first; rustfmt closes each at its own indent.
    let mut inline: Vec<String> = Vec::new();
    for (i, raw) in lines.iter().enumerate() {
        if inline.last().is_some_and(|close| raw == close) {
            inline.pop();
        }
        let line = code_of(raw);
        let found = |target: &str, out: &mut Vec<Reference>| {
            if modules.contains(target) {
                out.push(Reference { file: file.to_path_buf(), line: i + 1, target: target.to_string() });
            }
        };
        let mut at = 0;
        while let Some(pos) = line[at..].find("crate::") {
            let start = at + pos;
            at = start + "crate::".len();
            let before = line[..start].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let after = &line[at..];
            if let Some(group) = after.strip_prefix('{') {
                let mut rest = lines[i + 1..].iter().copied();
                for head in group_heads(group, &mut rest) {
                    found(&head, &mut out);
                }
            } else {
                found(identifier_at(after), &mut out);
            }
        }
        // `super::super::x` from a file (or inline module) deep enough
        // that the chain reaches the crate root names top-level `x`.
        let level = depth + inline.len();
        let mut at = 0;
        while let Some(pos) = line[at..].find("super::") {
            let start = at + pos;
            let before = line[..start].chars().next_back();
            let mut rest = &line[start..];
            let mut supers = 0;
            while let Some(r) = rest.strip_prefix("super::") {
                supers += 1;
                rest = r;
            }
            at = line.len() - rest.len();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            if supers == level {
                if let Some(group) = rest.strip_prefix('{') {
                    let mut more = lines[i + 1..].iter().copied();
                    for head in group_heads(group, &mut more) {
                        found(&head, &mut out);
                    }
                } else {
                    found(identifier_at(rest), &mut out);
                }
            }
        }
        let trimmed = line.trim_start();
        let opens_inline = trimmed.ends_with('{')
            && trimmed.trim_start_matches("pub ").trim_start_matches("pub(crate) ").starts_with("mod ");
        if opens_inline {
            let indent = &raw[..raw.len() - raw.trim_start().len()];
            inline.push(format!("{indent}}}"));
        }
    }
    out
}

fn rank_of(module: &str) -> Option<u8> {
    FLOORS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

fn relative(file: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    file.strip_prefix(root).unwrap_or(file).display().to_string()
}

#[test]
fn no_floor_imports_its_own_or_a_higher_one() {
    let modules = top_level_modules();
    let mut problems = Vec::new();
    for module in &modules {
        if rank_of(module).is_none() {
            problems.push(format!("src/{module}: a top-level module on no floor; give it one in tests/floors.rs"));
        }
    }
    // module -> imported module -> files naming it
    let mut table: BTreeMap<&str, BTreeMap<String, BTreeSet<PathBuf>>> = BTreeMap::new();
    for module in &modules {
        let imports = table.entry(module.as_str()).or_default();
        for (file, depth) in files_of(module) {
            for r in references_in(&file, depth, &modules) {
                if r.target == *module {
                    continue;
                }
                let (Some(mine), Some(theirs)) = (rank_of(module), rank_of(&r.target)) else { continue };
                let loc = format!("{}:{}", relative(&r.file), r.line);
                if theirs >= mine {
                    let way = if theirs == mine { "a sibling on its own floor" } else { "a higher floor" };
                    problems
                        .push(format!("{loc}: {module} (floor {mine}) imports {} (floor {theirs}), {way}", r.target));
                } else if THROUGH_THE_API.contains(&(module.as_str(), r.target.as_str())) {
                    problems.push(format!("{loc}: {module} imports {}, which it must reach through the API", r.target));
                }
                imports.entry(r.target).or_default().insert(r.file);
            }
        }
    }
    problems.extend(crate_roots());

    let mut by_floor: Vec<(&str, u8)> = FLOORS.to_vec();
    by_floor.sort_by_key(|(m, r)| (std::cmp::Reverse(*r), *m));
    let mut report = String::from("floor module      -> imports (files naming it)\n");
    for (module, rank) in by_floor {
        let Some(imports) = table.get(module) else {
            report.push_str(&format!("  {rank}   {module:<11} (no such module)\n"));
            continue;
        };
        let list: Vec<String> = imports.iter().map(|(m, files)| format!("{m}({})", files.len())).collect();
        let list = if list.is_empty() { "nothing".to_string() } else { list.join(" ") };
        report.push_str(&format!("  {rank}   {module:<11} -> {list}\n"));
    }
    if !problems.is_empty() {
        panic!("{} imports break the floors:\n{}\n\n{report}", problems.len(), problems.join("\n"));
    }
    println!("{report}");
}

/// `lib.rs` only declares the modules and `main.rs` only calls `cli`.
fn crate_roots() -> Vec<String> {
    let mut problems = Vec::new();
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("src/lib.rs");
    for (i, line) in lib.lines().enumerate() {
        let code = code_of(line).trim();
        if !(code.is_empty() || code.starts_with("pub mod ") || code.starts_with("#[")) {
            problems.push(format!("src/lib.rs:{}: more than module declarations: {code}", i + 1));
        }
    }
    let main = std::fs::read_to_string(src().join("main.rs")).expect("src/main.rs");
    for (i, line) in main.lines().enumerate() {
        let code = code_of(line);
        let mut at = 0;
        while let Some(pos) = code[at..].find("ferrok::") {
            at += pos + "ferrok::".len();
            let target = identifier_at(&code[at..]);
            if target != "cli" {
                problems.push(format!("src/main.rs:{}: main calls {target}, not only cli", i + 1));
            }
        }
    }
    problems
}

/// The reader itself: groups over several lines, aliases, `super` chains
/// that do or do not leave a top-level folder, comments.
#[test]
fn the_reader_finds_groups_and_climbing_supers() {
    let modules: BTreeSet<String> = ["agent", "client", "store", "pki"].iter().map(|s| s.to_string()).collect();
    let dir = std::env::temp_dir().join(format!("ferrok-floors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("x.rs");
    let text = "\
use crate::{client::informer, store as s,
    pki::{self, Ca}};
// use crate::agent::Kubelet;
use super::super::agent::x; // climbs out of src/m/x.rs
use super::sibling;
mod tests {
    use super::super::super::store;
}
use crate::agent; // crate::pki in a comment
";
    std::fs::write(&file, text).expect("temp file");
    let found: Vec<(usize, String)> =
        references_in(&file, 2, &modules).into_iter().map(|r| (r.line, r.target)).collect();
    let _ = std::fs::remove_dir_all(&dir);
    let expected = [(1, "client"), (1, "store"), (1, "pki"), (4, "agent"), (7, "store"), (9, "agent")];
    assert_eq!(found, expected.map(|(l, m)| (l, m.to_string())));
}
