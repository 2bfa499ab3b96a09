//! `cargo xtask setup`: installs what a fresh machine lacks, idempotently.
//!
//! Each step first checks whether its result is already there (a Debian package installed, a
//! rustup component present, `bpf-linker` answering, bpffs mounted) and does nothing if so, so a
//! second run takes well under a second. See shared/TOOLCHAIN.md for why each piece is pinned.
//!
//! The Python side (PyTorch for `ringside-testbed torch`, pytest) goes into a venv at
//! `<workspace>/target/venv` ([`venv_python`]): under `target/` so that a fresh clone gets it from
//! this command and nothing has to be installed by hand, `cargo clean` removes it with the rest of
//! the build output, and no system or user Python is touched.
//!
//! `cargo xtask fuzz` needs cargo-fuzz ([`ensure_cargo_fuzz`], a pinned version built from
//! crates.io, about 100 s) besides the nightly toolchain this command already checks; it installs
//! it itself on its first run, so `cargo xtask test` and `demo`, which do not fuzz, do not pay for it.
//!
//! The kernel matrix (`cargo xtask test`'s T1 on Debian's 6.1 and 6.12, xtask/src/kernel.rs) needs
//! QEMU and bookworm-backports in apt's sources ([`kernel_matrix_tools`]); the kernel packages
//! themselves are downloaded by the tier into `target/kernels/`, never installed.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context, Result};

use crate::util::{is_root, output, sh, succeeds, workspace_root};

/// Where a fresh machine gets Debian's 6.12 kernel (and, with qemu-utils from there, QEMU).
const BACKPORTS_SOURCE: &str = "/etc/apt/sources.list.d/ringside-bookworm-backports.sources";
const BACKPORTS_SOURCE_TEXT: &str = "# Added by ringside's `cargo xtask setup`: Debian's 6.12 kernel for the T1 kernel matrix.\n\
Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\n\
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";


/// Debian packages the build, the tests, the demo and the benchmarks use.
const DEB_PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "ip/tc/bridge for the namespace testbed"),
    ("nftables", "random-loss fault injection (there is no netem on the target kernels)"),
    ("iperf3", "point-to-point baseline in `bench collectives`"),
    ("ethtool", "testbed link settings"),
    ("util-linux", "setpriv: t2_privileges starts the agent with only its three capabilities"),
    ("llvm-22-dev", "bpf-linker links against LLVM 22"),
    ("libpolly-22-dev", "needed by LLVM 22's cmake/link configuration"),
    ("libzstd-dev", "LLVM link dependency"),
    ("zlib1g-dev", "LLVM link dependency"),
    ("openmpi-bin", "MPI_Allreduce baseline in `bench collectives`"),
    ("libopenmpi-dev", "mpicc for the MPI baseline"),
    ("fonts-dejavu-core", "the font of the `eval detection` plot's labels"),
    ("chromium", "headless browser that renders the agent's status page in T2 (t2_detect)"),
    ("gcc-aarch64-linux-gnu", "linker of `cargo xtask dist --target aarch64-unknown-linux-gnu` (the DPU's Arm cores)"),
    ("libc6-dev-arm64-cross", "the Arm glibc that linker and qemu-aarch64-static use"),
    ("qemu-user-static", "runs the aarch64 binaries and unit tests of `cargo xtask dist --check` here"),
    ("gcc", "compiles nccl-tuner/tests/harness.c, which loads the NCCL tuner plugin as NCCL does"),
    ("libc6-dev", "C headers (dlfcn.h, stdio.h) for that harness"),
    ("prometheus", "promtool for the rule tests (T0) and a real Prometheus server for t2_prometheus (T2)"),
    ("curl", "HTTP requests into the testbed's namespaces in the T2 tests"),
    // ipu-firmware's `rdma` feature (built and tested in T0): ibverbs-sys configures its vendored
    // rdma-core with cmake (which needs libnl and pkg-config), generates bindings with bindgen
    // (libclang), and links the system libibverbs.
    ("libibverbs-dev", "libibverbs to link ipu-firmware's `rdma` feature against (Debian's rdma-core)"),
    ("cmake", "ibverbs-sys configures its vendored rdma-core to generate the verbs bindings"),
    ("libclang-dev", "bindgen (in ibverbs-sys's build) parses verbs.h with libclang"),
    ("libnl-3-dev", "rdma-core's cmake configuration requires libnl-3"),
    ("libnl-route-3-dev", "rdma-core's cmake configuration requires libnl-route-3"),
    ("pkg-config", "rdma-core's cmake finds libnl through pkg-config"),
];

/// Debian packages whose installation enables a system service that the project does not use:
/// the tests start their own `prometheus` on a free port with a config in a temporary directory.
const UNWANTED_SERVICES: &[&str] = &["prometheus"];

/// The venv's packages, pinned: the plain PyPI Linux wheel of torch (it pulls NVIDIA libraries,
/// about 5 GB, and runs on the CPU here: the testbed's DDP job uses gloo), and pytest.
pub const VENV_PACKAGES: &[&str] = &["torch==2.15.0", "pytest==9.2.0"];

/// Written into the venv after a successful install, holding [`VENV_PACKAGES`]: a later run that
/// finds the same list (and torch importing) does nothing; a changed pin reinstalls.
const VENV_MARKER: &str = "ringside-packages.txt";

/// The tenants' Python package (`ringside`, with `ringside.torch`), installed editable into the venv.
const TENANT_PACKAGE: &str = "ringside-client/python";

/// The interpreter that creates the venv (CPython 3.11 on the project's machines).
const SYSTEM_PYTHON: &str = "python3";

const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const BPF_LINKER_VERSION: &str = "0.13.0";
/// `cargo fuzz` for `cargo xtask fuzz` (docs/fuzzing.md): the newest release, which builds with
/// the stable toolchain here (`--locked`: its own lock file, no newer dependencies that might
/// not). Its install took 97 s at nice 10 on the project's busy 2-core machine.
pub const CARGO_FUZZ_VERSION: &str = "0.13.2";

pub fn run() -> Result<()> {
    let started = Instant::now();
    let mut did = Vec::new();

    let missing: Vec<&str> =
        DEB_PACKAGES.iter().map(|(p, _)| *p).filter(|p| !deb_installed(p)).collect();
    if !missing.is_empty() {
        if !is_root() {
            bail!(
                "missing Debian packages: {}; run `sudo cargo xtask setup` or install them with apt-get",
                missing.join(" ")
            );
        }
        println!("setup: installing Debian packages: {}", missing.join(" "));
        apt_install(&missing, true)?;
        did.push(format!("installed {}", missing.join(" ")));
        for service in UNWANTED_SERVICES.iter().filter(|s| missing.contains(s)) {
            stop_service(service);
        }
    }

    let components = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .context("the nightly toolchain is needed to build the eBPF program (see shared/TOOLCHAIN.md)")?;
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        println!("setup: adding rust-src to the nightly toolchain");
        sh(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))?;
        did.push("added nightly rust-src".into());
    }

    let targets = output(Command::new("rustup").args(["target", "list", "--installed"]))
        .context("listing the installed rustup targets")?;
    if !targets.lines().any(|l| l.trim() == crate::dist::AARCH64) {
        println!("setup: adding the {} target (cargo xtask dist)", crate::dist::AARCH64);
        sh(Command::new("rustup").args(["target", "add", crate::dist::AARCH64]))?;
        did.push(format!("added the {} target", crate::dist::AARCH64));
    }

    if !bpf_linker_ok() {
        println!("setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about a minute)");
        // bpf-linker's own build script looks for LLVM through LLVM_PREFIX (else it finds the
        // system's default, LLVM 14, and fails to link -lLLVM); llvm-sys reads LLVM_SYS_221_PREFIX.
        sh(Command::new("cargo")
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
            .args(["--no-default-features", "--features", "llvm-22"])
            .env("LLVM_PREFIX", LLVM_PREFIX)
            .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX))?;
        did.push(format!("installed bpf-linker {BPF_LINKER_VERSION}"));
    }

    if !bpffs_mounted() {
        if is_root() {
            std::fs::create_dir_all("/sys/fs/bpf").ok();
            sh(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))?;
            did.push("mounted bpffs at /sys/fs/bpf".into());
        } else {
            println!("setup: bpffs is not mounted; as root run `mount -t bpf bpf /sys/fs/bpf`");
        }
    }

    if let Some(done) = kernel_matrix_tools()? {
        did.push(done);
    }

    if let Some(done) = ensure_venv()? {
        did.push(done);
    }

    if did.is_empty() {
        println!("setup: everything present ({:.1} s)", started.elapsed().as_secs_f64());
    } else {
        println!("setup: {} ({:.0} s)", did.join("; "), started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// Stops and disables a service that a package just installed enabled (Debian's `prometheus`
/// starts a server on :9090 where systemd runs). Best effort: without systemd (containers) the
/// package's start is refused by policy-rc.d or has no init to run it, and nothing is listening.
fn stop_service(service: &str) {
    if Path::new("/run/systemd/system").is_dir() {
        if succeeds(Command::new("systemctl").args(["disable", "--now", service])) {
            println!("setup: stopped and disabled the {service} service the package enabled (the tests run their own)");
        } else {
            println!("setup: could not stop the {service} service; it is not needed (`systemctl disable --now {service}`)");
        }
    } else if Path::new(&format!("/etc/init.d/{service}")).is_file() {
        // sysvinit-style start (if policy-rc.d allowed one); a no-op when it is not running.
        let _ = Command::new(format!("/etc/init.d/{service}")).arg("stop").output();
    }
}

fn deb_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Installs cargo-fuzz [`CARGO_FUZZ_VERSION`] unless `cargo fuzz --version` already names it.
/// `cargo xtask fuzz` calls it before building the targets. Returns what it did, or `None`.
pub fn ensure_cargo_fuzz() -> Result<Option<String>> {
    let want = format!("cargo-fuzz {CARGO_FUZZ_VERSION}");
    if output(Command::new("cargo").args(["fuzz", "--version"])).is_ok_and(|v| v.trim() == want) {
        return Ok(None);
    }
    let started = Instant::now();
    println!("setup: installing cargo-fuzz {CARGO_FUZZ_VERSION} (about two minutes)");
    sh(Command::new("cargo").args(["install", "cargo-fuzz", "--locked", "--version", CARGO_FUZZ_VERSION]))
        .context("installing cargo-fuzz failed (it needs crates.io); run `cargo xtask setup` again to retry")?;
    Ok(Some(format!("installed cargo-fuzz {CARGO_FUZZ_VERSION} in {:.0} s", started.elapsed().as_secs_f64())))
}

fn bpf_linker_ok() -> bool {
    succeeds(Command::new("bpf-linker").arg("--version"))
}

pub fn bpffs_mounted() -> bool {
    std::fs::read_to_string("/proc/mounts")
        .map(|m| m.lines().any(|l| l.split_whitespace().nth(2) == Some("bpf")))
        .unwrap_or(false)
}

/// `<workspace>/target/venv`: see the module docs for why it lives there.
pub fn venv_dir() -> PathBuf {
    workspace_root().join("target").join("venv")
}

/// The venv's Python (`<workspace>/target/venv/bin/python`), with torch and pytest once
/// `cargo xtask setup` has run. `ringside-testbed torch` finds the same path on its own (next to
/// its executable) or takes `RINGSIDE_PYTHON`.
pub fn venv_python() -> PathBuf {
    venv_dir().join("bin").join("python")
}

/// `apt-get install` of `packages`, non-interactive and without recommends; `update` first
/// refreshes the package lists (skipped when this run already did).
fn apt_install<S: AsRef<std::ffi::OsStr>>(packages: &[S], update: bool) -> Result<()> {
    if update {
        sh(Command::new("apt-get").args(["update", "-qq"]))?;
    }
    sh(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Creates the venv and installs [`VENV_PACKAGES`] unless the marker says they are there and
/// torch imports. Returns what it did, or `None` when nothing was needed.
fn ensure_venv() -> Result<Option<String>> {
    let dir = venv_dir();
    let python = venv_python();
    let marker = dir.join(VENV_MARKER);
    let want = VENV_PACKAGES.join("\n") + "\n" + TENANT_PACKAGE + "\n";
    if venv_ok(&python, &marker, &want) {
        return Ok(None);
    }
    let started = Instant::now();
    if !python.is_file() {
        println!("setup: creating the Python venv {}", dir.display());
        sh(Command::new(SYSTEM_PYTHON).args(["-m", "venv"]).arg(&dir)).with_context(|| {
            format!("creating the venv needs {SYSTEM_PYTHON} with its venv module (Debian: apt-get install -y python3-venv)")
        })?;
    }
    // Drop a stale marker before installing, so an interrupted install is never taken for a
    // finished one.
    let _ = std::fs::remove_file(&marker);
    println!("setup: pip install {} into {} (torch is ~5 GB: about a minute)", VENV_PACKAGES.join(" "), dir.display());
    sh(Command::new(&python)
        .args(["-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off"])
        .args(VENV_PACKAGES))
    .context("installing the venv's packages failed (it needs PyPI and ~6 GB of disk); run `cargo xtask setup` again to retry")?;
    // The tenants' package, editable: the training script and the T2 tests use this checkout's
    // `ringside` (ringside.torch), not a copy frozen at setup time.
    sh(Command::new(&python)
        .args(["-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "--no-deps", "-e"])
        .arg(workspace_root().join(TENANT_PACKAGE)))
    .context("installing the ringside Python package (ringside-client/python) into the venv failed")?;
    if !succeeds(Command::new(&python).args(["-c", "import torch, torch.distributed as d, ringside.torch; assert d.is_gloo_available()"])) {
        bail!("{} cannot import torch with gloo after the install; remove {} and run `cargo xtask setup` again", python.display(), dir.display());
    }
    std::fs::write(&marker, &want).with_context(|| format!("writing {}", marker.display()))?;
    Ok(Some(format!("installed {} into {} in {:.0} s", VENV_PACKAGES.join(" "), dir.display(), started.elapsed().as_secs_f64())))
}

/// The fast check of a second run: the marker lists exactly the pinned packages and torch imports.
fn venv_ok(python: &Path, marker: &Path, want: &str) -> bool {
    python.is_file()
        && std::fs::read_to_string(marker).is_ok_and(|m| m == want)
        && succeeds(Command::new(python).args(["-c", "import torch, ringside"]))
}

/// Installs what the kernel matrix needs on the host, idempotently: the bookworm-backports apt
/// source, QEMU, xz and zstd (module decompression). Part of [`run`]; the kernel tier calls it
/// too, so `--no-setup` on a machine without them still gets them.
pub fn kernel_matrix_tools() -> Result<Option<String>> {
    let mut did = Vec::new();
    if ensure_backports_source()? {
        did.push("added bookworm-backports to apt sources".to_owned());
    }
    let mut missing: Vec<String> = Vec::new();
    for (tool, pkg) in [("xz", "xz-utils"), ("zstd", "zstd")] {
        if !succeeds(Command::new(tool).arg("--version")) {
            missing.push(pkg.to_owned());
        }
    }
    if !succeeds(Command::new("qemu-system-x86_64").arg("--version")) {
        // QEMU's packages must come from one release: where qemu-utils is already installed from
        // bookworm-backports (it Breaks an older qemu-system-common), take the system emulator
        // from there too, naming each package so nothing else is upgraded.
        let utils = output(Command::new("dpkg-query").args(["-W", "-f=${Version}", "qemu-utils"])).unwrap_or_default();
        if utils.contains("bpo") {
            for p in ["qemu-system-x86", "qemu-system-common", "qemu-system-data", "seabios"] {
                missing.push(format!("{p}/bookworm-backports"));
            }
        } else {
            missing.push("qemu-system-x86".to_owned());
        }
    }
    if !missing.is_empty() {
        if !is_root() {
            bail!("the kernel matrix needs {}; run `sudo cargo xtask setup`", missing.join(" "));
        }
        println!("setup: installing {}", missing.join(" "));
        apt_install(&missing, did.is_empty())?;
        did.push(format!("installed {}", missing.join(" ")));
    }
    Ok(if did.is_empty() { None } else { Some(did.join("; ")) })
}

/// Adds bookworm-backports to apt's sources unless some source already names it; returns whether
/// it did (then it has also run `apt-get update`).
fn ensure_backports_source() -> Result<bool> {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        files.extend(dir.filter_map(|e| e.ok()).map(|e| e.path()));
    }
    let named = files.iter().any(|f| {
        fs::read_to_string(f).is_ok_and(|t| t.lines().any(|l| !l.trim_start().starts_with('#') && l.contains("bookworm-backports")))
    });
    if named {
        return Ok(false);
    }
    if !is_root() {
        bail!("Debian's 6.12 kernel comes from bookworm-backports, which apt does not know here; run `sudo cargo xtask setup` (it adds the source)");
    }
    println!("setup: adding bookworm-backports to apt sources ({BACKPORTS_SOURCE})");
    fs::write(BACKPORTS_SOURCE, BACKPORTS_SOURCE_TEXT).with_context(|| format!("writing {BACKPORTS_SOURCE}"))?;
    sh(Command::new("apt-get").args(["update", "-qq"]))?;
    Ok(true)
}
