//! sandbox-runner: the process runner inside a sandbox (docs/runner.md).
//!
//! `serve` owns processes and streams them over a unix socket, `connect` bridges an exec
//! stream's stdin/stdout to that socket (as base64 lines with `--text`), `version`
//! prints the versions.

mod archive;
mod args;
mod cgroup;
mod files;
mod frames;
mod process;
mod proto;
mod pump;
mod ring;
mod serve;
mod server;
mod sys;
mod textlink;

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let code = match args::parse(&argv) {
        Ok(args::Command::Version) => {
            println!("sandbox-runner {} protocol {}", proto::RUNNER_VERSION, proto::PROTOCOL_VERSION);
            0
        }
        Ok(args::Command::Help) => {
            print!("{}", args::USAGE);
            0
        }
        Ok(args::Command::Serve { socket, orphan_timeout, detach }) => {
            serve::serve(socket, orphan_timeout, detach)
        }
        Ok(args::Command::Connect { socket, start, text, ready, orphan_timeout }) => {
            serve::bridge(socket, start, text, ready.as_deref(), orphan_timeout)
        }
        Err(message) => {
            eprint!("sandbox-runner: {message}\n{}", args::USAGE);
            2
        }
    };
    std::process::exit(code);
}
