//! desktop-bench: how long a screenshot of a 1280x800 desktop takes in the agent (capture
//! through MIT-SHM, then PNG, lossless WebP or JPEG), against x11rb's raw capture alone, in the
//! same run. The goal: WebP at most 20 ms.
//!
//! It starts a real Xvfb with the agent's own code (root, Xvfb and python3-tk needed) and fills
//! the screen with a Tk canvas of text and coloured shapes, so the encoders see a busy desktop,
//! not a blank one.
//!
//!     cargo build --release -p computerd-bench --bin desktop-bench && target/release/desktop-bench
//!
//! `BENCH_SHOTS` (default 60) screenshots of each kind.

use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use computer_agent::desktop::encode;
use computer_agent::desktop::screen::Screen;
use computer_agent::desktop::xserver;
use computerd_bench::report::percentile_ms;
use computerd_proto::desktop::ImageFormat;
use computerd_proto::desktop::ScreenshotRequest;

const BUSY: &str = r##"
import random, sys, tkinter as tk
random.seed(7)
r = tk.Tk(); r.geometry("1280x800+0+0"); r.overrideredirect(True)
c = tk.Canvas(r, width=1280, height=800, bg="#f4f4f0", highlightthickness=0); c.pack()
for i in range(900):
    x, y = random.randrange(1280), random.randrange(800)
    col = "#%06x" % random.randrange(1 << 24)
    if i % 3 == 0:
        c.create_text(x, y, text="computerd %d lorem ipsum dolor" % i, fill=col, anchor="nw", font=("DejaVu Sans", 11))
    else:
        c.create_rectangle(x, y, x + random.randrange(8, 120), y + random.randrange(8, 60), fill=col, outline="")
r.after(500, lambda: open(sys.argv[1], "w").write("up"))
r.mainloop()
"##;

#[tokio::main]
async fn main() -> Result<()> {
    let shots: usize = std::env::var("BENCH_SHOTS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let run_dir = std::path::PathBuf::from(format!("/tmp/computerd-desktop-bench-{}", std::process::id()));
    let account = xserver::desktop_account().map_err(anyhow::Error::msg)?;
    let display = xserver::start("1280x800x24".parse().map_err(anyhow::Error::msg)?, account, &run_dir)
        .await
        .map_err(anyhow::Error::msg)
        .context("Xvfb (apt-get install xvfb), as root")?;
    let up = tempfile::NamedTempFile::new()?;
    let mut busy = std::process::Command::new("/usr/bin/python3")
        .args(["-c", BUSY])
        .arg(up.path())
        .env("DISPLAY", format!(":{}", display.number))
        .env("XAUTHORITY", &display.authority)
        .spawn()
        .context("python3-tk")?;
    let until = Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::read_to_string(up.path()).unwrap_or_default() != "up" {
        anyhow::ensure!(Instant::now() < until, "the busy window did not come up");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let d = display.clone();
    let report = tokio::task::spawn_blocking(move || -> Result<Vec<(String, Vec<u64>, usize)>> {
        let mut screen = Screen::connect(&d.socket(), &d.cookie, d.server_uid).map_err(anyhow::Error::msg)?;
        println!("capture path: {}; {} shots each", screen.capture_path(), shots);
        let mut rows = Vec::new();
        let mut raw = Vec::with_capacity(shots);
        for _ in 0..shots + 5 {
            let t = Instant::now();
            let p = screen.capture(None).map_err(anyhow::Error::msg)?;
            raw.push(t.elapsed().as_micros() as u64);
            std::hint::black_box(p);
        }
        rows.push(("raw capture (x11rb, MIT-SHM, RGB)".to_string(), raw.split_off(5), 0));
        for (name, format, quality) in [
            ("png", ImageFormat::Png, None),
            ("webp lossless", ImageFormat::Webp, None),
            ("jpeg q80", ImageFormat::Jpeg, Some(80)),
        ] {
            let req = ScreenshotRequest { format, quality, ..Default::default() };
            let mut times = Vec::with_capacity(shots);
            let mut size = 0;
            for _ in 0..shots + 5 {
                let t = Instant::now();
                let p = screen.capture(None).map_err(anyhow::Error::msg)?;
                let (_, _, bytes) = encode(p, &req).map_err(|e| anyhow::anyhow!(e.message))?;
                times.push(t.elapsed().as_micros() as u64);
                size = bytes.len();
            }
            rows.push((format!("screenshot {name}"), times.split_off(5), size));
        }
        Ok(rows)
    })
    .await??;
    let _ = busy.kill();
    let _ = busy.wait();
    let base = {
        let mut s = report[0].1.clone();
        s.sort_unstable();
        percentile_ms(&s, 0.5)
    };
    println!("{:<36} {:>9} {:>9} {:>10} {:>9}", "1280x800", "p50 ms", "p99 ms", "x raw p50", "bytes");
    for (name, mut times, size) in report {
        times.sort_unstable();
        let (p50, p99) = (percentile_ms(&times, 0.5), percentile_ms(&times, 0.99));
        println!("{name:<36} {p50:>9.2} {p99:>9.2} {:>10.2} {size:>9}", p50 / base);
    }
    let _ = std::fs::remove_dir_all(&run_dir);
    Ok(())
}
