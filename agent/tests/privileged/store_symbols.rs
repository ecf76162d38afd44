//! Symbols where the node has none (issue 51): the agent profiles a
//! stripped C program whose hot function is static, so nothing the node
//! holds names it (the stripped copy keeps only dynamic symbols). The agent
//! ships those frames as build id and file offset; a real `kiln-store`
//! names them at query time from a real `debuginfod` serving the program's
//! split debug info.

use std::process::{Command, Stdio};

use kiln_testkit::binaries::built_binary;
use kiln_testkit::debuginfod::{Debuginfod, split_c_program};
use kiln_testkit::http::{enc, get, stored_profile_type};
use kiln_testkit::process::KillOnDrop;
use kiln_testkit::store_process::StoreProcess;
use object::{Object, ObjectSymbol};

use crate::SERIAL;
use crate::agent_run::privileged_prerequisites;

const PROGRAM: &str = r#"
// noipa: no inlining, and no hoisting of the call out of the loop as pure.
static __attribute__((noipa)) unsigned long hot_static_work(unsigned long n) {
    unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++) acc = acc * 31 + i;
    return acc;
}
int main(void) {
    volatile unsigned long sink = 0;
    for (;;) sink += hot_static_work(1000000);
}
"#;

/// The folded stacks' total, and the part whose stack names `function`.
fn share_naming(folded: &str, function: &str) -> (u64, u64) {
    let mut total = 0;
    let mut naming = 0;
    for line in folded.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let count: u64 = count.parse().unwrap_or(0);
        total += count;
        if stack.split(';').any(|frame| frame == function) {
            naming += count;
        }
    }
    (total, naming)
}

#[test]
fn a_stripped_programs_static_function_is_named_by_the_store_from_debuginfod() {
    if !privileged_prerequisites() {
        return;
    }
    let Some(store_binary) = built_binary("kiln-store", "KILN_STORE_BIN") else {
        return;
    };
    let flags = [
        "-O1",
        "-fno-omit-frame-pointer",
        "-mno-omit-leaf-frame-pointer",
    ];
    let Some(program) = split_c_program(PROGRAM, "hot", &flags) else {
        return;
    };
    let Some(debuginfod) = Debuginfod::start(&program) else {
        return;
    };
    // Nothing on the node names it: the stripped copy's symbols (dynamic
    // only) lack it, so a name in the answer came from the debug file.
    let stripped = std::fs::read(&program.stripped).expect("stripped binary");
    let file = object::File::parse(&*stripped).expect("an ELF file");
    assert!(
        file.symbols()
            .chain(file.dynamic_symbols())
            .all(|s| s.name() != Ok("hot_static_work")),
        "the stripped copy still names hot_static_work"
    );

    let asked_before = debuginfod.requests_for(&program.build_id);
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let store = StoreProcess::start(
        &store_binary,
        &[
            "--debuginfod-urls",
            &debuginfod.url,
            "--symbolization-wait",
            "30s",
        ],
    );
    let workload = KillOnDrop(
        Command::new(&program.stripped)
            .stdout(Stdio::null())
            .spawn()
            .expect("the stripped program starts"),
    );
    let pid = workload.id().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
        .args(["--pid", &pid, "--frequency", "99"])
        .args(["--drain-interval", "5s", "--duration", "12s"])
        .args(["--store", &store.url(), "--metrics-addr", "off"])
        .output()
        .expect("the agent runs");
    assert!(
        output.status.success(),
        "the agent failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    drop(workload);

    // The store holds this test's program alone.
    let query = format!("{}{{}}", stored_profile_type(store.addr, "process_cpu:cpu"));
    let folded = get(
        store.addr,
        &format!("/api/v1/folded?query={}&from=now-10m&to=now", enc(&query)),
    );
    assert_eq!(folded.status, 200, "{}", folded.text());
    assert_eq!(
        folded.header("kiln-partial"),
        None,
        "the symbols were not ready within 30 s: {}",
        folded.text()
    );
    let text = folded.text();
    let (total, naming) = share_naming(&text, "hot_static_work");
    let share = naming as f64 / total.max(1) as f64;
    let asked = debuginfod.requests_for(&program.build_id) - asked_before;
    eprintln!(
        "hot_static_work named in {naming} of {total} ns ({:.1} %); the store asked debuginfod \
         {asked} times",
        share * 100.0,
    );
    assert!(total > 0, "no samples of the program stored:\n{text}");
    assert!(
        asked >= 1,
        "the store never asked debuginfod for the build id"
    );
    assert!(share >= 0.95, "{share:.3} of the samples name it:\n{text}");
}
