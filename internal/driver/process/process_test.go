package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/knotless-dev/knotless/internal/driver"
)

// fakeKCP is a stand-in for the kcp binary that only stays alive: the
// driver's bookkeeping (start detached, adopt, lost, terminate) is tested
// here; e2e tests run the real kcp.
func fakeKCP(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kcp")
	if err := os.WriteFile(p, []byte("#!/bin/sh\nexec sleep 300\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProvisionAdoptLostTerminate: a VM is started once (a second
// Provision, as after an agent restart, adopts it), reported Lost when its
// process dies and never started again, and Terminate removes it.
func TestProvisionAdoptLostTerminate(t *testing.T) {
	d := &Driver{Root: t.TempDir(), KCP: fakeKCP(t)}
	vm := driver.VM{ID: "uid-1", CPUMillis: 1000, MemoryMiB: 1024}
	ctx := context.Background()
	t.Cleanup(func() {
		for _, pid := range PIDs(d.Root) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	st, err := d.Provision(ctx, vm)
	if err != nil || st.State != driver.Starting {
		t.Fatalf("Provision: %+v, %v", st, err)
	}
	pids := PIDs(d.Root)
	if len(pids) != 1 || !driver.Alive(pids[0]) {
		t.Fatalf("pids %v", pids)
	}
	// Adopted, not started twice (a fresh driver: the agent restarted).
	d2 := &Driver{Root: d.Root, KCP: d.KCP}
	if st, err := d2.Provision(ctx, vm); err != nil || st.State != driver.Starting {
		t.Fatalf("second Provision: %+v, %v", st, err)
	}
	if got := PIDs(d.Root); len(got) != 1 || got[0] != pids[0] {
		t.Fatalf("a second process was started: %v", got)
	}
	if tok, err := d2.Credential(ctx, vm); err != nil || len(tok) != 48 {
		t.Errorf("credential %q, %v", tok, err)
	}
	// The process dies: Lost, and not started again.
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for driver.Alive(pids[0]) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if st, err := d2.Status(ctx, vm); err != nil || st.State != driver.Lost || st.Reason == "" {
		t.Fatalf("Status after the process died: %+v, %v", st, err)
	}
	if _, err := d2.Provision(ctx, vm); !errors.Is(err, driver.ErrLost) {
		t.Fatalf("Provision of a lost VM: %v, want ErrLost", err)
	}
	if err := d2.Terminate(ctx, vm); err != nil {
		t.Fatal(err)
	}
	if st, err := d2.Status(ctx, vm); err != nil || st.State != driver.Absent {
		t.Fatalf("after Terminate: %+v, %v", st, err)
	}
	if _, err := d2.Provision(ctx, driver.VM{ID: "../escape"}); err == nil {
		t.Error("a VM id with a path was accepted")
	}
}

// TestTerminateStopsARunningVM: Terminate stops a live process.
func TestTerminateStopsARunningVM(t *testing.T) {
	d := &Driver{Root: t.TempDir(), KCP: fakeKCP(t)}
	vm := driver.VM{ID: "uid-2"}
	if _, err := d.Provision(context.Background(), vm); err != nil {
		t.Fatal(err)
	}
	pid := PIDs(d.Root)[0]
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := d.Terminate(context.Background(), vm); err != nil {
		t.Fatal(err)
	}
	if driver.Alive(pid) {
		t.Error("the VM's process still runs")
	}
}

// startSleep starts `sleep 60` (an unrelated process, in a group of its
// own so that a group kill would reach it too) and returns it.
func startSleep(t *testing.T) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "60")
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	return c
}

// exited reports whether c ended (it is reaped here).
func exited(c *exec.Cmd, within time.Duration) bool {
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(within):
		return false
	}
}

// TestTerminateSparesAReusedPID: a VM whose recorded PID now names
// another process (the PID was reused after a reboot or a crash) is not
// that process: Terminate leaves it alone and Status reports the VM Lost.
// Both with a state file of this driver (start time and boot ID of the
// VM's process) and with one of an older driver (a bare PID).
func TestTerminateSparesAReusedPID(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		state func(pid int) string
	}{
		{"another process's PID", func(pid int) string {
			return fmt.Sprintf(`{"Port":1,"PID":%d,"Start":1,"Boot":"00000000-0000-0000-0000-000000000000","Token":"t"}`, pid)
		}},
		{"a bare PID (an older state file)", func(pid int) string {
			return fmt.Sprintf(`{"Port":1,"PID":%d,"Token":"t"}`, pid)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Driver{Root: t.TempDir(), KCP: fakeKCP(t)}
			vm := driver.VM{ID: "uid-reused"}
			sleep := startSleep(t)
			dir := filepath.Join(d.Root, vm.ID)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "vm.json"), []byte(tc.state(sleep.Process.Pid)), 0o600); err != nil {
				t.Fatal(err)
			}
			if st, err := d.Status(ctx, vm); err != nil || st.State != driver.Lost {
				t.Errorf("Status: %+v, %v; want Lost", st, err)
			}
			if err := d.Terminate(ctx, vm); err != nil {
				t.Fatal(err)
			}
			if exited(sleep, 500*time.Millisecond) {
				t.Fatal("Terminate killed a process that is not the VM's")
			}
		})
	}
}

// TestUpgradeAdoptsARunningVMOfAnOlderAgent: a state file of an older
// driver (a bare PID) whose PID runs this VM's own kcp (its command line
// names the VM's root directory) is adopted: the start time and boot ID
// are recorded, the VM is not Lost, and Terminate stops it (R03: an
// upgrade needs nothing done by hand).
func TestUpgradeAdoptsARunningVMOfAnOlderAgent(t *testing.T) {
	ctx := context.Background()
	d := &Driver{Root: t.TempDir(), KCP: fakeKCP(t)}
	vm := driver.VM{ID: "uid-old"}
	dir := filepath.Join(d.Root, vm.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A stand-in for the VM's kcp: its command line names the VM's root.
	cmd := exec.Command("/bin/sh", "-c", "while :; do sleep 1; done", "start", "--root-directory", filepath.Join(dir, "kcp"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	// Until the child has exec'd, its command line is the test's own (a
	// busy machine shows it): wait for the stand-in's.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
		if strings.Contains(string(raw), "--root-directory") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stand-in's command line: %q", raw)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "vm.json"), []byte(fmt.Sprintf(`{"Port":1,"PID":%d,"Token":"t"}`, cmd.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := d.Status(ctx, vm); err != nil || st.State == driver.Lost {
		t.Fatalf("Status: %+v, %v; want the VM adopted", st, err)
	}
	st, err := load(dir)
	if err != nil || st.Start == 0 || st.Boot == "" {
		t.Fatalf("state %+v, %v: want the start time and boot ID recorded", st, err)
	}
	if err := d.Terminate(ctx, vm); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Terminate did not stop the adopted VM's process")
	}
}

// TestFreePortsAreDistinct: the three ports of a tenant kcp (its API and
// its etcd's client and peer ports) are never the same port, which the
// kernel may give twice when each listener is closed before the next is
// picked.
func TestFreePortsAreDistinct(t *testing.T) {
	for range 200 {
		ports, err := freePorts("127.0.0.1", 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(ports) != 3 || ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
			t.Fatalf("ports %v", ports)
		}
	}
}
