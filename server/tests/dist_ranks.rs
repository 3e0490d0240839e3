//! One process per GPU (`--dist-init HOST:PORT --rank R --world-size W`): two `rocmforge
//! generate` ranks on two GPUs print the same greedy text as one GPU; a rank whose peer never
//! comes (or that has no GPU) exits with an error instead of hanging.
//!
//! The two-rank test runs where `rocmforge devices` lists two GPUs and a collective library
//! (skipped otherwise; `ROCMFORGE_REQUIRE_GPUS=2` makes that a failure). Every child gets
//! `NCCL_NVLS_ENABLE=0` (NVLink multicast is forbidden on the test machines).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn rf() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rocmforge"));
    c.env("NCCL_NVLS_ENABLE", "0");
    c
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A tiny synthetic llama whose two KV heads give each of two ranks one.
fn model() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dist-ranks");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("llama-{}.gguf", std::process::id()));
    let o = model::synth::SynthOptions::parse("llama", "tiny", "q8_0", 3).expect("options");
    model::synth::write(&o, None, &path).expect("write synthetic llama");
    path
}

/// Whether two GPUs and NCCL/RCCL are here, else why not (printed by the caller).
fn two_gpus() -> Result<(), String> {
    let out = rf().arg("devices").output().map_err(|e| e.to_string())?;
    let s = String::from_utf8_lossy(&out.stdout);
    if !s.contains("peer access [0] -> [1]") {
        return Err("fewer than two GPUs".into());
    }
    if !s.contains("collectives: ") {
        return Err(format!("no collective library: {s}"));
    }
    Ok(())
}

fn generate(m: &Path) -> Command {
    let mut c = rf();
    c.args(["generate", "-m"]).arg(m).args([
        "-p",
        "Once upon a time",
        "-n",
        "24",
        "--temp",
        "0",
        "--ignore-eos",
        "--device",
        "gpu",
        "-c",
        "256",
    ]);
    c
}

fn rank(m: &Path, addr: &str, r: usize, timeout_s: u64) -> Command {
    let mut c = generate(m);
    c.args([
        "--dist-init",
        addr,
        "--rank",
        &r.to_string(),
        "--world-size",
        "2",
    ])
    .args(["--dist-timeout", &timeout_s.to_string()])
    .args(["--devices", &r.to_string()]);
    c
}

/// `child`'s output, or a failure when it runs past `limit` (killed: a hang).
fn wait(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    loop {
        match child.try_wait().expect("wait") {
            Some(_) => return child.wait_with_output().expect("output"),
            None if start.elapsed() > limit => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "{what} still running after {limit:?} (a hang)\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn spawn(mut c: Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rocmforge")
}

#[test]
fn two_ranks_print_one_gpus_greedy_text() {
    if let Err(why) = two_gpus() {
        let need = std::env::var("ROCMFORGE_REQUIRE_GPUS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .is_some_and(|n| n >= 2);
        assert!(!need, "ROCMFORGE_REQUIRE_GPUS: {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let m = model();
    let mut one = generate(&m);
    one.args(["--split-mode", "none", "--devices", "0"]);
    let one = wait(spawn(one), Duration::from_secs(120), "one GPU");
    assert!(
        one.status.success(),
        "one GPU: {}",
        String::from_utf8_lossy(&one.stderr)
    );
    let addr = format!("127.0.0.1:{}", free_port());
    let r1 = spawn(rank(&m, &addr, 1, 60));
    let r0 = spawn(rank(&m, &addr, 0, 60));
    let r0 = wait(r0, Duration::from_secs(180), "rank 0");
    let r1 = wait(r1, Duration::from_secs(60), "rank 1");
    for (r, out) in [(0, &r0), (1, &r1)] {
        let err = String::from_utf8_lossy(&out.stderr);
        println!("rank {r}: {err}");
        assert!(out.status.success(), "rank {r} failed: {err}");
        assert!(err.contains(&format!("rank {r} of 2")), "rank {r}: {err}");
        assert!(err.contains("all-reduce"), "rank {r}: {err}");
    }
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    println!("one GPU: {}\nranks:   {}", text(&one), text(&r0));
    assert_eq!(text(&r0), text(&r1), "the ranks print the same text");
    assert_eq!(
        text(&r0),
        text(&one),
        "two ranks print one GPU's greedy text"
    );
}

#[test]
fn a_rank_without_its_peer_fails_instead_of_hanging() {
    let m = model();
    let addr = format!("127.0.0.1:{}", free_port());
    let out = wait(
        spawn(rank(&m, &addr, 0, 3)),
        Duration::from_secs(90),
        "a lone rank 0",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    println!("{err}");
    assert!(!out.status.success(), "a lone rank succeeded: {err}");
    if two_gpus().is_ok() {
        // With a GPU and the library it reaches the rendezvous, which names the address.
        assert!(err.contains(&addr) && err.contains("did not join"), "{err}");
    }
}

#[test]
fn a_rank_that_dies_ends_the_other_with_an_error() {
    if let Err(why) = two_gpus() {
        eprintln!("skipped: {why}");
        return;
    }
    let m = model();
    let addr = format!("127.0.0.1:{}", free_port());
    // A benchmark long enough that rank 1 dies mid-run.
    let long = |r: usize| {
        let mut c = rf();
        c.args(["bench", "-m"]).arg(&m).args([
            "-p", "16", "-n", "64", "-r", "100000", "--device", "gpu", "-c", "256",
        ]);
        c.args([
            "--dist-init",
            &addr,
            "--rank",
            &r.to_string(),
            "--world-size",
            "2",
        ])
        .args(["--dist-timeout", "10", "--devices", &r.to_string()]);
        c
    };
    let mut r1 = spawn(long(1));
    let r0 = spawn(long(0));
    std::thread::sleep(Duration::from_secs(4));
    let _ = r1.kill();
    let _ = r1.wait();
    let out = wait(r0, Duration::from_secs(90), "rank 0 after rank 1 died");
    let err = String::from_utf8_lossy(&out.stderr);
    println!("{err}");
    assert!(
        !out.status.success(),
        "rank 0 went on without rank 1: {err}"
    );
    // Killed mid-run the watchdog ends it; killed before joining, the rendezvous does.
    assert!(
        err.contains("collective")
            || err.contains("all_reduce")
            || err.contains("aborted")
            || err.contains("did not join"),
        "{err}"
    );
}
