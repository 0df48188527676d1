//! A Linux guest for what this host's kernel lacks (the `fq` qdisc that honours EDT departure
//! times, `netem`): QEMU without KVM (TCG: nested KVM hangs here, and user-mode Linux 6.1
//! dies on hosts with AMX), Debian's kernel and a static busybox, the host's root shared
//! read-only over 9p. The guest runs one ignored test of the calling test binary and powers
//! off; its console is the outer test's output. Timings in the guest are not the host's:
//! its tests assert order and rate, not microseconds.
//!
//! Debian packages: `qemu-system-x86 linux-image-amd64 busybox-static` (scripts/test
//! installs them).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Modules the guest needs for its 9p root, in the order they load (missing ones are built in).
const ROOT_MODULES: [&str; 10] = [
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "netfs",
    "fscache",
    "9pnet",
    "9pnet_virtio",
    "9p",
];

pub struct Guest {
    qemu: PathBuf,
    kernel: PathBuf,
    modules: PathBuf,
}

/// Set in the guest: the ignored test that runs there knows it is where it should be.
pub const IN_GUEST: &str = "FANOUT_IN_VM";

impl Guest {
    /// The guest's pieces, or why they are missing (then the caller skips loudly).
    pub fn find() -> Result<Guest, String> {
        let qemu = which("qemu-system-x86_64").ok_or("no qemu-system-x86_64 (Debian: qemu-system-x86)")?;
        let busybox = std::fs::read("/bin/busybox").map_err(|_| "no /bin/busybox (Debian: busybox-static)")?;
        if !static_elf(&busybox) {
            return Err("/bin/busybox is not static (Debian: busybox-static)".into());
        }
        // The newest installed kernel whose modules include fq.
        let mut kernels: Vec<(String, PathBuf)> = std::fs::read_dir("/boot")
            .map_err(|e| format!("/boot: {e}"))?
            .flatten()
            .filter_map(|e| Some((e.file_name().to_str()?.strip_prefix("vmlinuz-")?.to_string(), e.path())))
            .filter(|(v, _)| Path::new(&format!("/lib/modules/{v}/kernel/net/sched/sch_fq.ko")).exists())
            .collect();
        kernels.sort();
        let (version, kernel) = kernels.pop().ok_or("no /boot/vmlinuz-* with sch_fq.ko (Debian: linux-image-amd64)")?;
        Ok(Guest { qemu, kernel, modules: PathBuf::from(format!("/lib/modules/{version}")) })
    }

    /// Boots the guest, runs `test` of this test binary there (as root, lo up, `TMPDIR` a
    /// tmpfs under /run: the host's /tmp stays visible, as a checkout or this binary may be
    /// there) and returns whether it passed, with the guest's console.
    pub fn run_test(&self, test: &str, limit: Duration) -> (bool, String) {
        // One guest at a time: each takes both CPUs, and its tests time things.
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!("fanout-vm-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let exe = std::env::current_exe().unwrap();
        let script = dir.join("guest.sh");
        std::fs::write(
            &script,
            format!(
                "m() {{ /bin/busybox mount -t $1 $1 $2 || echo \"fanout-vm: mounting $1 on $2 failed\"; }}\n\
                 m proc /proc; m sysfs /sys; m tmpfs /run; m bpf /sys/fs/bpf; mkdir /run/tmp\n\
                 export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/run/tmp TMPDIR=/run/tmp {IN_GUEST}=1 RUST_BACKTRACE=1{pass}\n\
                 ip link set lo up && cd /run/tmp\n\
                 {} --exact {test} --ignored --nocapture --test-threads=1\n\
                 echo \"fanout-vm-exit $?\"\n\
                 /bin/busybox poweroff -f\n",
                exe.display(),
                pass = passed_on(),
            ),
        )
        .unwrap();
        let initrd = dir.join("initrd.cpio");
        std::fs::write(&initrd, self.initramfs(&script)).unwrap();
        let mut child = Command::new(&self.qemu)
            .args(["-m", "1G", "-smp", "2", "-cpu", "max", "-nographic", "-no-reboot", "-nic", "none", "-kernel"])
            .arg(&self.kernel)
            .arg("-initrd")
            .arg(&initrd)
            .args(["-append", "console=ttyS0 quiet panic=-1"])
            .args(["-virtfs", "local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qemu");
        let mut out = child.stdout.take().unwrap();
        let console = std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = out.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        });
        let end = Instant::now() + limit;
        let timed_out = loop {
            if child.try_wait().unwrap().is_some() {
                break false;
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                break true;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let mut console = console.join().unwrap();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut console);
        }
        if timed_out {
            console.push_str(&format!("\n(the guest did not finish within {limit:?})\n"));
        }
        let _ = std::fs::remove_dir_all(&dir);
        (console.contains("fanout-vm-exit 0"), console)
    }

    /// The guest's first root: busybox, the modules of the 9p root, an `/init` that mounts the
    /// host's root and hands over to `script` there.
    fn initramfs(&self, script: &Path) -> Vec<u8> {
        let mut c = Cpio::default();
        for d in ["bin", "dev", "proc", "sys", "lib", "newroot"] {
            c.entry(d, 0o040755, &[], 0);
        }
        c.entry("dev/console", 0o020600, &[], 5 << 8 | 1);
        c.entry("bin/busybox", 0o100755, &std::fs::read("/bin/busybox").unwrap(), 0);
        let mut load = String::new();
        for m in ROOT_MODULES {
            let found = walk(&self.modules.join("kernel"), &format!("{m}.ko"));
            if let Some(p) = found {
                c.entry(&format!("lib/{m}.ko"), 0o100644, &std::fs::read(p).unwrap(), 0);
                load.push_str(&format!("/bin/busybox insmod /lib/{m}.ko\n"));
            }
        }
        let init = format!(
            "#!/bin/busybox sh\n\
             /bin/busybox mount -t proc proc /proc\n\
             /bin/busybox mount -t devtmpfs dev /dev\n\
             {load}\
             /bin/busybox mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose hostroot /newroot \
             || {{ echo 'fanout-vm: no 9p root'; /bin/busybox poweroff -f; }}\n\
             /bin/busybox mount --move /dev /newroot/dev\n\
             /bin/busybox umount /proc\n\
             exec /bin/busybox switch_root /newroot /bin/sh {}\n",
            script.display()
        );
        c.entry("init", 0o100755, init.as_bytes(), 0);
        c.finish()
    }
}

/// A file named `name` under `dir`.
fn walk(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = walk(&p, name) {
                return Some(f);
            }
        } else if e.file_name() == name {
            return Some(p);
        }
    }
    None
}

/// Whether an x86-64 ELF executable has no program interpreter (`PT_INTERP`): it runs alone.
fn static_elf(b: &[u8]) -> bool {
    let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]) as usize);
    let Some(phoff) = b.get(0x20..0x28).map(|s| u64::from_le_bytes(s.try_into().unwrap()) as usize) else {
        return false;
    };
    let (Some(size), Some(n)) = (u16_at(0x36), u16_at(0x38)) else { return false };
    b.starts_with(b"\x7fELF\x02")
        && (0..n).all(|i| b.get(phoff + i * size..phoff + i * size + 4).is_some_and(|t| t != [3, 0, 0, 0]))
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(cmd)).find(|p| p.is_file())
}

/// An initramfs: a cpio archive in the kernel's "newc" format.
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8], rdev: u32) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0,
            0,
            if mode & 0o040000 != 0 { 2 } else { 1 },
            0,
            data.len() as u32,
            0,
            0,
            rdev >> 8,
            rdev & 0xff,
            name.len() as u32 + 1,
            0,
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[], 0);
        self.out
    }
}

/// The host's `FANOUT_GUEST_*` variables, as ` NAME=VALUE` for the guest's `export` line:
/// how a run asks the guest's test for more (`FANOUT_GUEST_BENCH=full`).
fn passed_on() -> String {
    std::env::vars()
        .filter(|(k, v)| {
            k.starts_with("FANOUT_GUEST_") && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.,".contains(&b))
        })
        .map(|(k, v)| format!(" {k}={v}"))
        .collect()
}
