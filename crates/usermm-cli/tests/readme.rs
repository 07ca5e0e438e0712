//! The shell examples of README.md and docs/*.md: every `usermm` command line in a ```sh block
//! must parse (run with `--help` inserted, which makes clap check every option name and every
//! value with a fixed set of choices, and exit 0), and the quick-start ones that are cheap run
//! as written (README's `usermm run` block, `usermm info`); `cargo` lines are what built this
//! test and are not run again.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The ```sh blocks of a Markdown file: (first line number, text).
fn sh_blocks(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let mut cur: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut cur {
            None if line.trim_start().starts_with("```sh") => cur = Some((i + 2, String::new())),
            Some(_) if line.trim_start().starts_with("```") => out.push(cur.take().unwrap()),
            Some((_, t)) => {
                t.push_str(line);
                t.push('\n');
            }
            None => {}
        }
    }
    out
}

/// Splits a command line into words like sh (quotes, backslashes, `#` comments); None for a
/// line with shell syntax this test does not interpret (`$`, pipes, redirections, `&&`).
fn words(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut w = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '#' if !in_word => break,
            ' ' | '\t' => {
                if in_word {
                    out.push(std::mem::take(&mut w));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    w.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => w.push(chars.next()?),
                        '$' | '`' => return None,
                        c => w.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                w.push(chars.next()?);
            }
            '$' | '|' | '>' | '<' | '&' | ';' | '`' | '(' | ')' => return None,
            c => {
                in_word = true;
                w.push(c);
            }
        }
    }
    if in_word {
        out.push(w);
    }
    Some(out)
}

/// The logical lines of a block (backslash continuations joined).
fn logical_lines(block: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for l in block.lines() {
        if let Some(x) = l.strip_suffix('\\') {
            cur.push_str(x);
            cur.push(' ');
        } else {
            cur.push_str(l);
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The arguments given to usermm by a command line, if it runs usermm.
fn usermm_args(w: &[String]) -> Option<Vec<String>> {
    let first = w.first()?;
    if first == "usermm" || first.ends_with("/usermm") {
        return Some(w[1..].to_vec());
    }
    if first == "cargo"
        && w.get(1).is_some_and(|s| s == "run")
        && w.iter().any(|x| x == "usermm-cli")
    {
        let dd = w.iter().position(|x| x == "--")?;
        return Some(w[dd + 1..].to_vec());
    }
    None
}

fn doc_files() -> Vec<PathBuf> {
    let mut v = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

#[test]
fn every_usermm_example_parses() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for f in doc_files() {
        for (line_no, block) in sh_blocks(&f) {
            for line in logical_lines(&block) {
                let Some(w) = words(&line) else { continue };
                let Some(mut args) = usermm_args(&w) else {
                    continue;
                };
                let at = args.iter().position(|a| a == "--").unwrap_or(args.len());
                args.insert(at, "--help".into());
                let o = Command::new(env!("CARGO_BIN_EXE_usermm"))
                    .args(&args)
                    .output()
                    .unwrap();
                checked += 1;
                let out = String::from_utf8_lossy(&o.stdout);
                if !o.status.success() || !out.contains("Usage:") {
                    failures.push(format!(
                        "{}:{line_no}: {line}\n  {}",
                        f.display(),
                        String::from_utf8_lossy(&o.stderr).trim()
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "examples that do not parse:\n{}",
        failures.join("\n")
    );
    assert!(checked >= 20, "only {checked} usermm examples found");
}

#[test]
fn the_splitter_handles_quotes_and_comments() {
    assert_eq!(
        words("usermm run --budget 64M -- python3 -c 'import numpy as np; print(1)'  # c"),
        Some(
            [
                "usermm",
                "run",
                "--budget",
                "64M",
                "--",
                "python3",
                "-c",
                "import numpy as np; print(1)"
            ]
            .map(String::from)
            .to_vec()
        )
    );
    assert_eq!(words("seq 3 | shuf > /tmp/x"), None);
    assert_eq!(
        logical_lines("a \\\n  b\nc\n"),
        vec!["a    b".to_string(), "c".to_string()]
    );
}

/// README's `usermm run` quick start, as written (without its cargo line).
#[test]
fn readme_usermm_run_quick_start_runs() {
    let readme = root().join("README.md");
    let block = sh_blocks(&readme)
        .into_iter()
        .map(|(_, b)| b)
        .find(|b| b.contains("usermm run") && b.contains("shuf"))
        .expect("README has the usermm run quick start");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_usermm"));
    assert!(
        block.contains("target/release/usermm"),
        "the quick start runs the release build"
    );
    let script: String = logical_lines(&block)
        .into_iter()
        .filter(|l| !l.trim_start().starts_with("cargo "))
        .map(|l| l.replace("target/release/usermm", &bin.display().to_string()) + "\n")
        .collect();
    let o = Command::new("sh")
        .args(["-ec", &script])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{script}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let out = std::fs::read_to_string("/tmp/out.txt").unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1_000_000);
    assert_eq!((lines[0], lines[999_999]), ("1", "1000000"));
    assert!(String::from_utf8_lossy(&o.stdout).contains("33554432"));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("exited with status 0"), "{e}");
}

#[test]
fn usermm_info_runs() {
    let o = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .arg("info")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("userfaultfd"));
}
