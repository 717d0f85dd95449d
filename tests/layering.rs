//! Note [Layers] in src/lib.rs, held: each folder of `src/` says in its
//! `mod.rs` which folders it may use ("May use: `base`, `memory`."), those
//! declarations form no cycle, and no file names (by a `crate::` path) a
//! folder its own does not declare. The crate root, `src/lib.rs`, wires the
//! layers together and may name any of them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Each folder of `src/` and the folders its `mod.rs` says it may use.
fn declared_uses(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut folders = BTreeMap::new();
    for entry in fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_dir() {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let doc = fs::read_to_string(path.join("mod.rs"))
            .unwrap_or_else(|_| panic!("src/{name}/ has no mod.rs to say what it may use"));
        folders.insert(name.clone(), may_use(&doc).unwrap_or_else(|| {
            panic!("src/{name}/mod.rs has no \"May use:\" line in its //! comment")
        }));
    }
    folders
}

/// The folders named in the "May use:" sentence of a module comment
/// (`nothing else` for none), which may wrap over `//!` lines.
fn may_use(doc: &str) -> Option<BTreeSet<String>> {
    let comment: String = doc
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .map(|line| line.trim_start_matches("//!").trim())
        .collect::<Vec<_>>()
        .join(" ");
    let sentence = comment.split("May use:").nth(1)?;
    let sentence = sentence.split('.').next().unwrap_or("");
    Some(
        sentence
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    )
}

/// The folders of the crate named by `crate::folder` paths in `source`,
/// in code (comments are skipped: a doc may mention any layer).
fn named_folders(source: &str, folders: &BTreeSet<String>) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            // `crate::{a, b::c}` names each group member's first segment.
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group
                    .split('}')
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .map(|item| item.trim())
                    .collect(),
                None => vec![rest],
            };
            for name in names {
                let first: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if folders.contains(&first) {
                    named.insert(first);
                }
            }
        }
    }
    named
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// A folder order in which each comes after everything it may use; the
/// folders of a cycle are left out (and reported by the caller).
fn layer_order(uses: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    while order.len() < uses.len() {
        let next = uses.iter().find(|(folder, used)| {
            !order.contains(folder) && used.iter().all(|u| order.contains(u) || *u == **folder)
        });
        match next {
            Some((folder, _)) => order.push(folder.clone()),
            None => break,
        }
    }
    order
}

#[test]
fn src_folders_use_only_the_layers_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let uses = declared_uses(&src);
    let folders: BTreeSet<String> = uses.keys().cloned().collect();
    assert!(folders.len() >= 2, "src/ has no layer folders: {folders:?}");

    for (folder, used) in &uses {
        let unknown: Vec<_> = used.difference(&folders).collect();
        assert!(unknown.is_empty(), "src/{folder}/mod.rs may use {unknown:?}, which are no folders of src/");
    }
    let order = layer_order(&uses);
    assert_eq!(
        order.len(),
        uses.len(),
        "the \"May use:\" declarations form a cycle among {:?}",
        folders.iter().filter(|f| !order.contains(f)).collect::<Vec<_>>()
    );

    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let Some(folder) = relative.components().next().filter(|_| relative.components().count() > 1) else {
            continue; // lib.rs, the crate root, wires every layer
        };
        let folder = folder.as_os_str().to_string_lossy().into_owned();
        let source = fs::read_to_string(file).unwrap();
        for named in named_folders(&source, &folders) {
            if named != folder && !uses[&folder].contains(&named) {
                violations.push(format!(
                    "src/{} names crate::{named}, but src/{folder}/ may use only {:?} (Note [Layers] in src/lib.rs: invert the call with a hook, Note [Hooks] in src/base/hook.rs)",
                    relative.display(),
                    uses[&folder]
                ));
            }
        }
    }
    assert!(violations.is_empty(), "{} edges against the layers:\n{}", violations.len(), violations.join("\n"));
}

#[test]
fn the_checks_read_paths_groups_and_declarations() {
    let folders: BTreeSet<String> = ["base", "runtime", "bridge"].map(String::from).into();
    let source = "use crate::base::error::Result;\nuse crate::{runtime::stream, base};\n// crate::bridge in a comment\nlet x = crate::runtime::device::count(); // crate::bridge\n";
    assert_eq!(
        named_folders(source, &folders),
        ["base", "runtime"].map(String::from).into()
    );
    assert_eq!(
        may_use("//! Holds things.\n//! May use: `base`,\n//! `memory`.\n\npub mod x;\n"),
        Some(["base", "memory"].map(String::from).into())
    );
    assert_eq!(may_use("//! May use: nothing else in the crate.\n"), Some(BTreeSet::new()));
    assert_eq!(may_use("//! No declaration.\n"), None);
    let cyclic: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), ["b".to_string()].into()),
        ("b".to_string(), ["a".to_string()].into()),
        ("c".to_string(), BTreeSet::new()),
    ]
    .into();
    assert_eq!(layer_order(&cyclic), vec!["c".to_string()]);
}
