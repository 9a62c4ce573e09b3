//! Command-line arguments.

use std::path::PathBuf;
use std::time::Duration;

/// The usage text.
pub const USAGE: &str = "usage:
  sandbox-runner serve --socket PATH [--orphan-timeout SECS] [--detach]
  sandbox-runner connect --socket PATH [--start] [--text [--ready TOKEN]] [--orphan-timeout SECS]
  sandbox-runner version
";

/// The default orphan timeout (seconds without any client before everything ends).
pub const DEFAULT_ORPHAN_TIMEOUT: u64 = 3600;

/// What to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Serve {
        socket: PathBuf,
        orphan_timeout: Option<Duration>,
        detach: bool,
    },
    Connect {
        socket: PathBuf,
        start: bool,
        text: bool,
        ready: Option<String>,
        orphan_timeout: Option<Duration>,
    },
    Version,
    Help,
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, String> {
    let Some((first, rest)) = args.split_first() else { return Err("a command is required".into()) };
    match first.as_str() {
        "version" | "--version" => return Ok(Command::Version),
        "help" | "--help" | "-h" => return Ok(Command::Help),
        "serve" | "connect" => {}
        other => return Err(format!("unknown command {other:?}")),
    }
    let mut socket = None;
    let mut timeout = DEFAULT_ORPHAN_TIMEOUT;
    let mut detach = false;
    let mut start = false;
    let mut text = false;
    let mut ready = None;
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |what: &str| -> Result<String, String> {
            inline.clone().or_else(|| it.next().cloned()).ok_or_else(|| format!("{what} needs a value"))
        };
        match name {
            "--socket" => {
                let v = value("--socket")?;
                if v.is_empty() {
                    return Err("--socket is empty".into());
                }
                socket = Some(PathBuf::from(v));
            }
            "--orphan-timeout" => {
                let v = value("--orphan-timeout")?;
                timeout =
                    v.parse().map_err(|_| format!("--orphan-timeout wants whole seconds, not {v:?}"))?;
            }
            "--detach" if first == "serve" && inline.is_none() => detach = true,
            "--start" if first == "connect" && inline.is_none() => start = true,
            "--text" if first == "connect" && inline.is_none() => text = true,
            "--ready" if first == "connect" => {
                let v = value("--ready")?;
                // Printed back as is: only a short word that no terminal acts on.
                if v.is_empty() || v.len() > 64 || !v.bytes().all(|c| c.is_ascii_alphanumeric()) {
                    return Err(format!("--ready wants 1 to 64 letters or digits, not {v:?}"));
                }
                ready = Some(v);
            }
            _ => return Err(format!("unknown option {arg:?} for {first}")),
        }
    }
    let socket = socket.ok_or("--socket PATH is required")?;
    if ready.is_some() && !text {
        return Err("--ready goes with --text".into());
    }
    let orphan_timeout = (timeout > 0).then(|| Duration::from_secs(timeout));
    Ok(if first == "serve" {
        Command::Serve { socket, orphan_timeout, detach }
    } else {
        Command::Connect { socket, start, text, ready, orphan_timeout }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, String> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn serve_options() {
        assert_eq!(
            p(&["serve", "--socket", "/s", "--orphan-timeout", "5", "--detach"]),
            Ok(Command::Serve {
                socket: "/s".into(),
                orphan_timeout: Some(Duration::from_secs(5)),
                detach: true
            })
        );
        assert_eq!(
            p(&["serve", "--socket=/s"]),
            Ok(Command::Serve {
                socket: "/s".into(),
                orphan_timeout: Some(Duration::from_secs(3600)),
                detach: false
            })
        );
        assert_eq!(
            p(&["serve", "--socket", "/s", "--orphan-timeout=0"]),
            Ok(Command::Serve { socket: "/s".into(), orphan_timeout: None, detach: false })
        );
    }

    #[test]
    fn connect_options() {
        assert_eq!(
            p(&["connect", "--start", "--socket", "/s"]),
            Ok(Command::Connect {
                socket: "/s".into(),
                start: true,
                text: false,
                ready: None,
                orphan_timeout: Some(Duration::from_secs(3600))
            })
        );
        assert_eq!(
            p(&["connect", "--text", "--socket", "/s"]),
            Ok(Command::Connect {
                socket: "/s".into(),
                start: false,
                text: true,
                ready: None,
                orphan_timeout: Some(Duration::from_secs(3600))
            })
        );
        assert_eq!(
            p(&["connect", "--text", "--ready", "a1B2", "--socket", "/s"]),
            Ok(Command::Connect {
                socket: "/s".into(),
                start: false,
                text: true,
                ready: Some("a1B2".into()),
                orphan_timeout: Some(Duration::from_secs(3600))
            })
        );
    }

    #[test]
    fn refusals() {
        for bad in [
            &[][..],
            &["serve"][..],
            &["serve", "--socket"],
            &["serve", "--socket", ""],
            &["serve", "--socket", "/s", "--start"],
            &["connect", "--socket", "/s", "--detach"],
            &["serve", "--socket", "/s", "--text"],
            &["connect", "--socket", "/s", "--text=1"],
            &["connect", "--socket", "/s", "--ready", "x"],
            &["connect", "--socket", "/s", "--text", "--ready", ""],
            &["connect", "--socket", "/s", "--text", "--ready", "a b"],
            &["connect", "--socket", "/s", "--text", "--ready", "\u{1b}]0;x"],
            &["serve", "--socket", "/s", "--ready", "x"],
            &["serve", "--socket", "/s", "--orphan-timeout", "-1"],
            &["serve", "--socket", "/s", "--orphan-timeout", "1.5"],
            &["serve", "--socket", "/s", "extra"],
            &["launch"],
        ] {
            assert!(p(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn version_and_help() {
        assert_eq!(p(&["version"]), Ok(Command::Version));
        assert_eq!(p(&["--help"]), Ok(Command::Help));
    }
}
