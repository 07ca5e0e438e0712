//! ARCHITECTURE.md's promise about mm/'s layering, checked on the sources: no two modules of
//! mm/ use each other (the graph of `super::x` / `crate::mm::x` references outside comments and
//! test modules has no two-way edge), apart from `manager.rs`, which holds `MmInner` and `Mm`
//! and which the others name the way kernel code names its globals. A change that makes two
//! modules depend on each other fails here with the pair and where each names the other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The module names `src` refers to through `super::` or `crate::mm::`, with the first line of
/// each, outside comments and outside `#[cfg(...test...)] mod` blocks (taken to run to the end
/// of the file, as they do in mm/).
fn references(src: &str, modules: &BTreeSet<String>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut lines = src.lines().enumerate().peekable();
    let mut in_use_group = false;
    while let Some((n, line)) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(") && t.contains("test") {
            if let Some((_, next)) = lines.peek() {
                if next.trim_start().starts_with("mod ") {
                    break;
                }
            }
        }
        if t.starts_with("//") {
            continue;
        }
        let code = t.split("//").next().unwrap_or("");
        let mut names = Vec::new();
        for prefix in ["super::", "crate::mm::"] {
            let mut rest = code;
            while let Some(i) = rest.find(prefix) {
                rest = &rest[i + prefix.len()..];
                if let Some(group) = rest.strip_prefix('{') {
                    in_use_group = !group.contains('}');
                    names.extend(group.split(['}', ',']).map(|s| s.trim().to_string()));
                } else {
                    let id: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    names.push(id);
                }
            }
        }
        if in_use_group && !code.contains("super::") {
            names.extend(code.split(['}', ',']).map(|s| s.trim().to_string()));
            if code.contains('}') {
                in_use_group = false;
            }
        }
        for name in names {
            let name = name.split("::").next().unwrap_or("").trim().to_string();
            if modules.contains(&name) {
                out.entry(name).or_insert(n + 1);
            }
        }
    }
    out
}

#[test]
fn no_two_mm_modules_use_each_other() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/mm");
    let mut sources = BTreeMap::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "rs") {
            let name = p.file_stem().unwrap().to_string_lossy().to_string();
            if name != "mod" {
                sources.insert(name, std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    assert!(sources.len() > 20, "mm/ has {} modules", sources.len());
    let modules: BTreeSet<String> = sources.keys().cloned().collect();
    let graph: BTreeMap<&String, BTreeMap<String, usize>> = sources
        .iter()
        .map(|(name, src)| {
            let mut r = references(src, &modules);
            r.remove(name);
            r.remove("manager");
            (name, r)
        })
        .collect();
    let mut two_way = Vec::new();
    for (a, refs) in &graph {
        for (b, line_a) in refs {
            if let Some(line_b) = graph[b].get(*a) {
                if a.as_str() < b.as_str() {
                    two_way.push(format!(
                        "{a}.rs:{line_a} names {b}, {b}.rs:{line_b} names {a}"
                    ));
                }
            }
        }
    }
    assert!(
        two_way.is_empty(),
        "modules of mm/ that use each other:\n{}",
        two_way.join("\n")
    );
    // The check itself sees dependencies: the fault path uses the page cache.
    assert!(graph[&"memory".to_string()].contains_key("filemap"));
}
