//! `cargo xtask test --kernel VERSION`: the T1 tests (the real classifier under
//! `BPF_PROG_TEST_RUN`) on other kernels than the host's, each booted under QEMU.
//!
//! Per kernel:
//! 1. Debian's kernel package for that version (the `linux-image-amd64` metapackage of the release
//!    that carries it: 6.1 in bookworm / bookworm-security, 6.12 in bookworm-backports) is fetched
//!    with `apt-get download` and unpacked with `dpkg-deb -x` into a scratch directory, from which
//!    `target/kernels/VERSION/` keeps only `vmlinuz` and the few modules the guest needs (virtio
//!    PCI and 9p, with their dependencies read from each module's `depends=`, decompressed). The
//!    package is never installed as the machine's kernel. A `package` file records what was
//!    fetched, so a second run reuses it unless apt knows a newer one.
//! 2. A small initramfs (a `newc` cpio written here) holds a static busybox (Debian's
//!    busybox-static, fetched the same way) and those modules. Its `/init` loads them, mounts the
//!    host's root read-only over 9p at `/host`, mounts proc, sysfs, devtmpfs, a tmpfs on `/tmp` and
//!    bpffs inside it, and runs every T1 test binary (built on the host) chrooted there with
//!    `--ignored --test-threads=1`, printing to the serial console, then powers off.
//! 3. The host reads the console line by line, sums libtest's result lines, and fails the kernel if
//!    the guest booted another kernel, a binary exited non-zero, nothing passed, or the guest did not
//!    finish within [`GUEST_TIMEOUT`] (QEMU is then killed). The whole console goes to
//!    `target/kernels/VERSION/console.log`.
//!
//! Acceleration: KVM when the host's KVM is a hardware one (`kvm_intel` / `kvm_amd`), else QEMU's
//! TCG (software, multi-threaded). Some cloud sandboxes expose `/dev/kvm` through `kvm_pvm`, a
//! PVM hypervisor that only runs guest kernels built for PVM: a stock Debian kernel stops in its
//! decompressor there ("KVM internal error ... emulation failure"), so PVM means TCG.
//! `RINGSIDE_QEMU_ACCEL=kvm|tcg` overrides the choice.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::util::{is_root, output, sh, succeeds, workspace_root};


/// Kernels `cargo xtask test` boots without a `--kernel` list: the oldest kernel ringside supports
/// (docs/operator-guide.md) and a recent long-term one.
pub const DEFAULT_KERNELS: &[&str] = &["6.1", "6.12"];

/// How long one guest may take from QEMU's start to its power-off: the bound only catches a hung
/// guest. Under TCG on 2 cores the T1 run takes 300-340 s on 6.1 (its verifier walks the flow
/// monitor nearly a million instructions per load) and 110-130 s on 6.12 on a quiet machine of
/// 2026-11-24, but 696 s and 264 s on the slower quiet machine of 2026-11-27 at 18:09 UTC, and
/// 1014 s and 419 s (t1_flowmon alone 900 s on 6.1) at 22:20 UTC the same day, quiet too; TCG slows
/// with every other process on the host: at 600 s, and once at 1200 s on a busy machine, the 6.1
/// guest was killed while still passing tests. A hung guest still ends at this bound.
pub const GUEST_TIMEOUT: Duration = Duration::from_secs(1800);

/// Modules the guest loads (with their dependencies first) to mount the host's root over 9p.
const GUEST_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p"];

/// The 9p mount tag of the host's root filesystem.
const MOUNT_TAG: &str = "hostroot";

/// Prefix of the lines the guest's `/init` prints for the host to parse.
const GUEST_MARK: &str = "ringside-guest:";

/// A kernel ready to boot: its image and the modules its initramfs loads, in load order.
#[derive(Debug)]
pub struct GuestKernel {
    /// What was asked for, e.g. `6.1`.
    pub version: String,
    /// The Debian package and version, e.g. `linux-image-6.1.0-56-amd64 6.1.192-2`.
    pub package: String,
    /// `uname -r` of the kernel, e.g. `6.1.0-56-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
    /// Decompressed `.ko` files, dependencies before their users.
    pub modules: Vec<PathBuf>,
}

fn kernels_dir() -> PathBuf {
    workspace_root().join("target/kernels")
}

/// Checks a requested version: `MAJOR.MINOR`, as `--kernel` documents.
pub fn parse_version(v: &str) -> Result<String> {
    let ok = v.split_once('.').is_some_and(|(a, b)| {
        !a.is_empty() && !b.is_empty() && a.bytes().all(|c| c.is_ascii_digit()) && b.bytes().all(|c| c.is_ascii_digit())
    });
    if !ok {
        bail!("--kernel takes MAJOR.MINOR (e.g. 6.1 or 6.12), not `{v}`");
    }
    Ok(v.to_owned())
}

/// The Debian kernel package for `version` that apt knows: the dependency of the newest
/// `linux-image-amd64` whose version is `version.*`. Runs `apt-get update` once if none is known.
fn resolve_package(version: &str) -> Result<(String, String)> {
    for attempt in 0..2 {
        let madison = output(Command::new("apt-cache").args(["madison", "linux-image-amd64"]))?;
        let mut best: Option<String> = None;
        for line in madison.lines() {
            let Some(v) = line.split('|').nth(1).map(str::trim) else { continue };
            if !v.starts_with(&format!("{version}.")) {
                continue;
            }
            if best.as_deref().is_none_or(|b| dpkg_newer(v, b)) {
                best = Some(v.to_owned());
            }
        }
        if let Some(meta) = best {
            let deps = output(Command::new("apt-cache").args(["depends", &format!("linux-image-amd64={meta}")]))?;
            let pkg = deps
                .lines()
                .filter_map(|l| l.trim().strip_prefix("Depends: "))
                .find(|p| p.starts_with("linux-image-"))
                .with_context(|| format!("linux-image-amd64 {meta} names no linux-image package"))?
                .to_owned();
            let pkg_version = output(Command::new("apt-cache").args(["show", "--no-all-versions", &pkg]))?
                .lines()
                .find_map(|l| l.strip_prefix("Version: "))
                .map(str::to_owned)
                .with_context(|| format!("apt-cache show {pkg} gives no version"))?;
            return Ok((pkg, pkg_version));
        }
        if attempt == 0 {
            if !is_root() {
                break;
            }
            sh(Command::new("apt-get").args(["update", "-qq"]))?;
        }
    }
    bail!(
        "apt knows no Debian kernel {version} (linux-image-amd64 {version}.*): Debian 12 has 6.1 (bookworm) and 6.12 (bookworm-backports, which `cargo xtask setup` adds to apt sources); see `apt-cache madison linux-image-amd64`"
    )
}

fn dpkg_newer(a: &str, b: &str) -> bool {
    succeeds(Command::new("dpkg").args(["--compare-versions", a, "gt", b]))
}

/// Downloads `pkg=version` into a fresh scratch directory and unpacks it there; returns the
/// unpacked tree. The caller removes the scratch directory.
fn fetch_deb(pkg: &str, version: &str, scratch: &Path) -> Result<PathBuf> {
    let _ = fs::remove_dir_all(scratch);
    fs::create_dir_all(scratch)?;
    println!("kernels: apt-get download {pkg}={version}");
    // As root, apt warns that its sandbox user cannot write here; the download is the same.
    sh(Command::new("apt-get").current_dir(scratch).args(["download", "-qq", "-o", "APT::Sandbox::User=root", &format!("{pkg}={version}")]))
        .with_context(|| format!("downloading {pkg} {version} failed; check the network and `apt-get update`"))?;
    let deb = fs::read_dir(scratch)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download {pkg} left no .deb in {}", scratch.display()))?;
    let tree = scratch.join("root");
    sh(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree))?;
    Ok(tree)
}

/// The guest kernel for `version`, fetched and trimmed into `target/kernels/VERSION/` unless the
/// same package is there already.
pub fn prepare(version: &str) -> Result<GuestKernel> {
    let (pkg, pkg_version) = resolve_package(version)?;
    let dir = kernels_dir().join(version);
    let stamp = dir.join("package");
    let want = format!("{pkg} {pkg_version}\n");
    let release = pkg.strip_prefix("linux-image-").unwrap_or(&pkg).to_owned();
    let list = dir.join("modules.txt");
    // Reused only when complete: the stamp is written last, and a module list is never empty
    // (9p is a module in Debian's kernels).
    if let (true, Ok(names)) = (fs::read_to_string(&stamp).is_ok_and(|s| s == want), fs::read_to_string(&list)) {
        let modules: Vec<PathBuf> = names.lines().map(|n| dir.join("modules").join(n)).collect();
        if dir.join("vmlinuz").is_file() && !modules.is_empty() && modules.iter().all(|m| m.is_file()) {
            return Ok(GuestKernel { version: version.into(), package: want.trim().into(), release, vmlinuz: dir.join("vmlinuz"), modules });
        }
    }
    let started = Instant::now();
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("modules"))?;
    let scratch = kernels_dir().join(format!(".scratch-{version}"));
    let tree = fetch_deb(&pkg, &pkg_version, &scratch)?;
    fs::copy(tree.join(format!("boot/vmlinuz-{release}")), dir.join("vmlinuz"))
        .with_context(|| format!("{pkg} has no boot/vmlinuz-{release}"))?;
    let modules = resolve_modules(&tree.join("lib/modules").join(&release), GUEST_MODULES)?;
    let mut names = Vec::new();
    for (name, bytes) in &modules {
        let file = format!("{name}.ko");
        fs::write(dir.join("modules").join(&file), bytes)?;
        names.push(file);
    }
    fs::write(&list, names.join("\n") + "\n")?;
    fs::write(dir.join("config"), fs::read(tree.join(format!("boot/config-{release}")))?)?;
    let _ = fs::remove_dir_all(&scratch);
    fs::write(&stamp, &want)?;
    println!("kernels: {} ready in {} ({:.0} s)", want.trim(), dir.display(), started.elapsed().as_secs_f64());
    Ok(GuestKernel {
        version: version.into(),
        package: want.trim().into(),
        release,
        vmlinuz: dir.join("vmlinuz"),
        modules: names.iter().map(|n| dir.join("modules").join(n)).collect(),
    })
}

/// Module name as the kernel knows it: file name without `.ko[.xz|.zst|.gz]`, `-` as `_`.
fn module_name(file: &str) -> Option<String> {
    let stem = file.split_once(".ko").filter(|(_, rest)| rest.is_empty() || [".xz", ".zst", ".gz"].contains(rest))?.0;
    Some(stem.replace('-', "_"))
}

/// The `depends=` entry of a module's `.modinfo` section (NUL-separated `key=value` strings).
fn modinfo_depends(ko: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(at) = ko.windows(KEY.len()).position(|w| w == KEY) else { return Vec::new() };
    let rest = &ko[at + KEY.len()..];
    let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end]).split(',').filter(|s| !s.is_empty()).map(|s| s.replace('-', "_")).collect()
}

fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        "xz"
    } else if name.ends_with(".zst") {
        "zstd"
    } else if name.ends_with(".gz") {
        "gzip"
    } else {
        return fs::read(path).with_context(|| format!("reading {}", path.display()));
    };
    let out = Command::new(tool).arg("-dc").arg(path).output().with_context(|| format!("cannot run {tool}; run `cargo xtask setup`"))?;
    if !out.status.success() {
        bail!("{tool} -dc {} failed: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out.stdout)
}

/// `targets` and everything they depend on, decompressed, dependencies first; modules built into
/// the kernel (`modules.builtin`) are left out.
fn resolve_modules(modules_dir: &Path, targets: &[&str]) -> Result<Vec<(String, Vec<u8>)>> {
    let builtin: BTreeSet<String> = fs::read_to_string(modules_dir.join("modules.builtin"))
        .with_context(|| format!("{} has no modules.builtin", modules_dir.display()))?
        .lines()
        .filter_map(|l| l.rsplit('/').next().and_then(module_name))
        .collect();
    let mut files = BTreeMap::new();
    let mut stack = vec![modules_dir.join("kernel")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(n) = p.file_name().and_then(|n| module_name(&n.to_string_lossy())) {
                files.insert(n, p);
            }
        }
    }
    fn visit(
        name: &str,
        files: &BTreeMap<String, PathBuf>,
        builtin: &BTreeSet<String>,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<(String, Vec<u8>)>,
    ) -> Result<()> {
        if builtin.contains(name) || !seen.insert(name.to_owned()) {
            return Ok(());
        }
        let path = files.get(name).with_context(|| format!("the kernel has module `{name}` neither built in nor as a file"))?;
        let ko = read_module(path)?;
        for dep in modinfo_depends(&ko) {
            visit(&dep, files, builtin, seen, out)?;
        }
        out.push((name.to_owned(), ko));
        Ok(())
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for t in targets {
        visit(t, &files, &builtin, &mut seen, &mut out)?;
    }
    Ok(out)
}

/// Debian's static busybox, fetched once into `target/kernels/busybox` (written under another
/// name and renamed, so a reader never sees a partial file). Not safe to call from two threads
/// for the first time: the matrix calls it once before booting its guests side by side.
pub fn busybox() -> Result<PathBuf> {
    let path = kernels_dir().join("busybox");
    if path.is_file() {
        return Ok(path);
    }
    let version = output(Command::new("apt-cache").args(["show", "--no-all-versions", "busybox-static"]))?
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .map(str::to_owned)
        .context("apt knows no busybox-static; run `apt-get update`")?;
    let scratch = kernels_dir().join(".scratch-busybox");
    let tree = fetch_deb("busybox-static", &version, &scratch)?;
    let partial = kernels_dir().join(".busybox.partial");
    fs::copy(tree.join("bin/busybox"), &partial).context("busybox-static has no bin/busybox")?;
    fs::rename(&partial, &path)?;
    let _ = fs::remove_dir_all(&scratch);
    Ok(path)
}

/// A `newc` cpio archive (what the kernel unpacks as an initramfs), built in memory.
#[derive(Default)]
struct Cpio {
    bytes: Vec<u8>,
    next_ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.next_ino += 1;
        let nlink = if mode & 0o040000 != 0 { 2 } else { 1 };
        let header = format!(
            "070701{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}",
            self.next_ino, mode, 0, 0, nlink, 0, data.len(), 0, 0, 0, 0, name.len() + 1, 0
        );
        self.bytes.extend_from_slice(header.as_bytes());
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, &[]);
    }
    fn file(&mut self, name: &str, executable: bool, data: &[u8]) {
        self.entry(name, if executable { 0o100755 } else { 0o100644 }, data);
    }
    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }
    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.bytes
    }
}

/// Quotes a word for the guest's busybox sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The guest's `/init`: load modules, mount the host root, run each test binary, power off.
fn init_script(kernel: &GuestKernel, tests: &[PathBuf], env: &[(String, String)]) -> String {
    let mut s = String::from(
        "#!/bin/busybox sh\n\
/bin/busybox --install -s /bin\n\
export PATH=/bin\n\
mount -t proc proc /proc\nmount -t sysfs sysfs /sys\nmount -t devtmpfs devtmpfs /dev\n",
    );
    s += &format!(
        "fail() {{ echo \"{GUEST_MARK} error: $*\"; poweroff -f; echo o > /proc/sysrq-trigger; sleep 60; }}\n\
echo \"{GUEST_MARK} kernel $(uname -r)\"\n\
test -e /sys/kernel/btf/vmlinux && echo \"{GUEST_MARK} btf yes\" || echo \"{GUEST_MARK} btf no\"\n"
    );
    for m in &kernel.modules {
        let n = m.file_name().unwrap().to_string_lossy();
        s += &format!("insmod /lib/modules/{n} || fail insmod {n}\n");
    }
    // The guest's writable scratch directory, a tmpfs over a host directory: /tmp, unless the
    // checkout (test binaries, eBPF object) lives under it, e.g. a clone in `mktemp -d`; the tmpfs
    // would hide it.
    let host_paths: Vec<String> = tests.iter().map(|t| t.to_string_lossy().into_owned()).chain(env.iter().map(|(_, v)| v.clone())).collect();
    let scratch = ["/tmp", "/run", "/mnt"]
        .into_iter()
        .find(|d| !host_paths.iter().any(|p| p.starts_with(&format!("{d}/"))))
        .unwrap_or("/mnt");
    s += &format!(
        "mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 {MOUNT_TAG} /host || fail mounting the host root over 9p\n\
mount -t proc proc /host/proc && mount -t sysfs sysfs /host/sys && mount -t devtmpfs devtmpfs /host/dev \
&& mount -t tmpfs tmpfs /host{scratch} && mount -t bpf bpf /host/sys/fs/bpf || fail mounting proc, sys, dev, {scratch}, bpffs in /host\n"
    );
    let env: String = env.iter().map(|(k, v)| format!(" {k}={}", sh_quote(v))).collect();
    for t in tests {
        let name = t.file_name().unwrap().to_string_lossy();
        s += &format!(
            "echo \"{GUEST_MARK} run {name}\"\n\
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME={scratch} TMPDIR={scratch} RUST_BACKTRACE=1{env} chroot /host {} --ignored --test-threads=1\n\
echo \"{GUEST_MARK} exit {name} $?\"\n",
            sh_quote(&t.to_string_lossy())
        );
    }
    s += &format!("echo \"{GUEST_MARK} done\"\npoweroff -f\necho o > /proc/sysrq-trigger\nsleep 60\n");
    s
}

fn initramfs(kernel: &GuestKernel, tests: &[PathBuf], env: &[(String, String)]) -> Result<Vec<u8>> {
    let mut c = Cpio::default();
    for d in ["bin", "dev", "proc", "sys", "host", "lib", "lib/modules"] {
        c.dir(d);
    }
    c.file("bin/busybox", true, &fs::read(busybox()?)?);
    for m in &kernel.modules {
        let n = m.file_name().unwrap().to_string_lossy();
        c.file(&format!("lib/modules/{n}"), false, &fs::read(m)?);
    }
    c.file("init", true, init_script(kernel, tests, env).as_bytes());
    Ok(c.finish())
}

/// Which QEMU accelerator to use, and why.
fn accelerator() -> (&'static str, String) {
    match std::env::var("RINGSIDE_QEMU_ACCEL").as_deref() {
        Ok("kvm") => return ("kvm", "RINGSIDE_QEMU_ACCEL=kvm".into()),
        Ok("tcg") => return ("tcg", "RINGSIDE_QEMU_ACCEL=tcg".into()),
        _ => {}
    }
    let hw = ["kvm_intel", "kvm_amd"].iter().any(|m| Path::new("/sys/module").join(m).exists());
    if !Path::new("/dev/kvm").exists() {
        ("tcg", "no /dev/kvm".into())
    } else if Path::new("/sys/module/kvm_pvm").exists() && !hw {
        ("tcg", "/dev/kvm is kvm_pvm, which boots only PVM-built guest kernels".into())
    } else if hw {
        ("kvm", "hardware KVM".into())
    } else {
        ("tcg", "/dev/kvm is neither kvm_intel nor kvm_amd".into())
    }
}

/// Kills QEMU if the run ends early (error, timeout, panic).
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one guest run showed.
#[derive(Debug, Default)]
pub struct GuestRun {
    pub uname: Option<String>,
    pub btf: Option<bool>,
    /// Test binaries and their exit codes, as the guest reported them.
    pub exits: Vec<(String, i32)>,
    pub done: bool,
    pub error: Option<String>,
}

impl GuestRun {
    /// Notes a console line the guest's `/init` printed.
    fn note(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix(GUEST_MARK).map(str::trim) else { return };
        if let Some(k) = rest.strip_prefix("kernel ") {
            self.uname = Some(k.to_owned());
        } else if let Some(b) = rest.strip_prefix("btf ") {
            self.btf = Some(b == "yes");
        } else if let Some(e) = rest.strip_prefix("exit ") {
            if let Some((name, code)) = e.rsplit_once(' ') {
                self.exits.push((name.to_owned(), code.parse().unwrap_or(-1)));
            }
        } else if rest == "done" {
            self.done = true;
        } else if let Some(e) = rest.strip_prefix("error: ") {
            self.error = Some(e.to_owned());
        }
    }
}

/// Boots `kernel` with the T1 binaries `tests`, echoing and logging its console; `line` sees every
/// console line (the caller counts libtest's results). Returns what the guest reported; an error
/// when QEMU cannot start or the guest times out.
pub fn boot(kernel: &GuestKernel, tests: &[PathBuf], env: &[(String, String)], mut line: impl FnMut(&str)) -> Result<GuestRun> {
    let dir = kernels_dir().join(&kernel.version);
    let initrd = dir.join("initramfs.cpio");
    fs::write(&initrd, initramfs(kernel, tests, env)?)?;
    let (accel, why) = accelerator();
    println!("kernels: booting {} under QEMU ({accel}: {why})", kernel.package);
    let mut cmd = Command::new("qemu-system-x86_64");
    if accel == "kvm" {
        cmd.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        cmd.args(["-accel", "tcg,thread=multi", "-cpu", "max"]);
    }
    cmd.args(["-m", "2G", "-smp", "2", "-no-reboot", "-display", "none", "-serial", "stdio", "-monitor", "none", "-net", "none"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .arg("-virtfs")
        .arg(format!("local,path=/,mount_tag={MOUNT_TAG},security_model=none,readonly=on,multidevs=remap"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut qemu = Qemu(cmd.spawn().context("cannot start qemu-system-x86_64; run `cargo xtask setup`")?);
    let (tx, rx) = mpsc::channel::<String>();
    for pipe in [qemu.0.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>), qemu.0.stderr.take().map(|p| Box::new(p) as _)]
        .into_iter()
        .flatten()
    {
        let tx = tx.clone();
        thread::spawn(move || {
            let mut r = BufReader::new(pipe);
            let mut buf = Vec::new();
            while r.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                let l = String::from_utf8_lossy(&buf).trim_end_matches(['\r', '\n']).to_owned();
                if tx.send(l).is_err() {
                    break;
                }
                buf.clear();
            }
        });
    }
    drop(tx);
    let mut log = fs::File::create(dir.join("console.log"))?;
    let deadline = Instant::now() + GUEST_TIMEOUT;
    let mut run = GuestRun::default();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                println!("[{}] {l}", kernel.version);
                writeln!(log, "{l}")?;
                run.note(&l);
                line(&l);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!(
                    "the {} guest did not power off within {} s (console: {}); QEMU was killed",
                    kernel.package,
                    GUEST_TIMEOUT.as_secs(),
                    dir.join("console.log").display()
                );
            }
        }
    }
    let status = qemu.0.wait()?;
    if !status.success() && run.error.is_none() {
        run.error = Some(format!("qemu exited with {status}"));
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_and_depends() {
        assert_eq!(module_name("9pnet_virtio.ko").as_deref(), Some("9pnet_virtio"));
        assert_eq!(module_name("virtio-pci.ko.xz").as_deref(), Some("virtio_pci"));
        assert_eq!(module_name("netfs.ko.zst").as_deref(), Some("netfs"));
        assert_eq!(module_name("modules.order"), None);
        assert_eq!(module_name("x.ko.sig"), None);
        let ko = b"\x7fELF...\0license=GPL\0depends=9pnet,fscache,netfs\0retpoline=Y\0";
        assert_eq!(modinfo_depends(ko), vec!["9pnet", "fscache", "netfs"]);
        assert!(modinfo_depends(b"\0depends=\0name=9pnet\0").is_empty());
        assert!(modinfo_depends(b"no modinfo here").is_empty());
    }

    #[test]
    fn cpio_newc_layout() {
        let mut c = Cpio::default();
        c.dir("bin");
        c.file("init", true, b"#!/bin/sh\n");
        let bytes = c.finish();
        assert_eq!(&bytes[..6], b"070701");
        assert_eq!(bytes.len() % 4, 0);
        // The second header starts 4-aligned after "bin\0" (110 + 4 = 114, padded to 116).
        assert_eq!(&bytes[116..122], b"070701");
        // File size field of "init" (7th field) is 10 bytes.
        assert_eq!(&bytes[116 + 6 + 6 * 8..116 + 6 + 7 * 8], b"0000000A");
        assert!(bytes.windows(10).any(|w| w == b"TRAILER!!!"));
    }

    #[test]
    fn guest_lines() {
        let mut r = GuestRun::default();
        for l in ["ringside-guest: kernel 6.1.0-56-amd64\r", "ringside-guest: btf yes", "test result: ok. 1 passed", "ringside-guest: exit t1_flowmon-abc 0", "ringside-guest: done"] {
            r.note(l);
        }
        assert_eq!(r.uname.as_deref(), Some("6.1.0-56-amd64"));
        assert_eq!(r.btf, Some(true));
        assert_eq!(r.exits, vec![("t1_flowmon-abc".to_string(), 0)]);
        assert!(r.done && r.error.is_none());
    }

    #[test]
    fn versions() {
        assert_eq!(parse_version("6.12").unwrap(), "6.12");
        for bad in ["6", "6.", "v6.1", "6.1.0", "latest"] {
            assert!(parse_version(bad).is_err(), "{bad}");
        }
    }
}
