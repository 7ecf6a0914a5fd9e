package kind

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/knotless-dev/knotless/internal/driver"
)

// TestClusterName: every VM id gives a distinct valid kind name (kind:
// [a-z0-9.-], warns past 50 characters; the node container adds
// "-control-plane"), the same one every time.
func TestClusterName(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z0-9.-]+$`)
	seen := map[string]string{}
	for _, id := range []string{"9f0c1e4e-2b7c-4d2e-9a51-0c6f5a7d1b23", "uid-1", "UPPER_case", strings.Repeat("x", 300), "uid-2"} {
		n := ClusterName(id)
		if !valid.MatchString(n) || len(n) > 50 || len(NodeName(n)) > 63 {
			t.Errorf("%q: name %q is not a valid kind cluster name", id, n)
		}
		if n != ClusterName(id) {
			t.Errorf("%q: the name changes", id)
		}
		if other, ok := seen[n]; ok {
			t.Errorf("%q and %q share the name %q", id, other, n)
		}
		seen[n] = id
	}
}

// TestConfig: the kind configuration names the cluster, puts the API
// server on the host at a port kind picks, and reserves for the system
// all of the machine but the shape, so the node's allocatable is the
// shape.
func TestConfig(t *testing.T) {
	vm := driver.VM{ID: "uid-1", CPUMillis: 1500, MemoryMiB: 2048}
	b, err := Config(vm, "10.0.0.7", Capacity{CPUs: 4, MemoryBytes: 8 << 30}, "")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Kind, APIVersion string
		Name             string
		Networking       struct {
			APIServerAddress string `json:"apiServerAddress"`
			APIServerPort    *int   `json:"apiServerPort"`
		}
		Nodes                []struct{ Role string }
		KubeadmConfigPatches []string `json:"kubeadmConfigPatches"`
	}
	if err := yaml.UnmarshalStrict(b, &cfg); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if cfg.Kind != "Cluster" || cfg.APIVersion != "kind.x-k8s.io/v1alpha4" || cfg.Name != ClusterName("uid-1") ||
		cfg.Networking.APIServerAddress != "10.0.0.7" || cfg.Networking.APIServerPort == nil || *cfg.Networking.APIServerPort != 0 ||
		len(cfg.Nodes) != 1 || cfg.Nodes[0].Role != "control-plane" || len(cfg.KubeadmConfigPatches) != 1 {
		t.Fatalf("config:\n%s", b)
	}
	var kubelet struct {
		APIVersion, Kind string
		SystemReserved   map[string]string `json:"systemReserved"`
	}
	if err := yaml.UnmarshalStrict([]byte(cfg.KubeadmConfigPatches[0]), &kubelet); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"cpu": "2500m", "memory": "6442450944"} // 4000m-1500m, 8 GiB-2 GiB
	if kubelet.Kind != "KubeletConfiguration" || kubelet.APIVersion != "kubelet.config.k8s.io/v1beta1" ||
		kubelet.SystemReserved["cpu"] != want["cpu"] || kubelet.SystemReserved["memory"] != want["memory"] {
		t.Errorf("kubelet patch %+v, want systemReserved %v", kubelet, want)
	}
}

// TestShapesRefused: a shape below the smallest node, or larger than the
// machine, gets no configuration.
func TestShapesRefused(t *testing.T) {
	c := Capacity{CPUs: 2, MemoryBytes: 4 << 30}
	for name, vm := range map[string]driver.VM{
		"too little memory": {ID: "a", CPUMillis: 1000, MemoryMiB: MinMemoryMiB - 1},
		"too little CPU":    {ID: "a", CPUMillis: MinCPUMillis - 1, MemoryMiB: 2048},
		"more CPU":          {ID: "a", CPUMillis: 2001, MemoryMiB: 2048},
		"more memory":       {ID: "a", CPUMillis: 1000, MemoryMiB: 4097},
	} {
		if _, err := Config(vm, "127.0.0.1", c, ""); !errors.Is(err, driver.ErrUnrunnable) {
			t.Errorf("%s: %v, want ErrUnrunnable", name, err)
		}
	}
	if _, err := Config(driver.VM{ID: "a", CPUMillis: 2000, MemoryMiB: 4096}, "127.0.0.1", c, ""); err != nil {
		t.Errorf("the whole machine: %v", err)
	}
}

// TestScript: the provisioning script creates the cluster, limits its
// node to the shape (CPU quota, memory with swap) and loads the preloaded
// images, each argument one shell word whatever it holds.
func TestScript(t *testing.T) {
	vm := driver.VM{ID: "uid-1", CPUMillis: 1250, MemoryMiB: 1536}
	s := Script("/opt/kind bin/kind", "docker", "knotless.dev/node:v1", vm, []string{"test/server:abc", "it's;$(rm -rf /)"})
	name := ClusterName("uid-1")
	for _, want := range []string{
		"set -eu\n",
		"'/opt/kind bin/kind' create cluster --name " + name + " --image 'knotless.dev/node:v1' --config kind.yaml --kubeconfig kubeconfig\n",
		"'docker' update --cpus 1.250 --memory 1610612736 --memory-swap 1610612736 " + name + "-control-plane\n",
		"'/opt/kind bin/kind' load docker-image --name " + name + " 'test/server:abc' 'it'\\''s;$(rm -rf /)'\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q:\n%s", want, s)
		}
	}
	// The shell reads the hostile image name back as one word.
	out, err := exec.Command("/bin/sh", "-c", "printf '%s\\n' "+quote("it's;$(rm -rf /)")).Output()
	if err != nil || string(out) != "it's;$(rm -rf /)\n" {
		t.Errorf("quoted word read back as %q, %v", out, err)
	}
	if strings.Contains(Script("kind", "docker", "img", vm, nil), "load") {
		t.Error("a script without images to preload loads some")
	}
}

// TestPhase: how provisioning and the node container map to a VM's state.
func TestPhase(t *testing.T) {
	running := &container{}
	running.State.Running = true
	stopped := &container{}
	stopped.State.Status, stopped.State.ExitCode = "exited", 137
	restarting := &container{}
	restarting.State.Running, restarting.State.Restarting = true, true
	for _, c := range []struct {
		name  string
		p     Progress
		alive bool
		c     *container
		want  driver.State
	}{
		{"provisioning", Progress{Proc: driver.Proc{PID: 10}}, true, nil, driver.Starting},
		{"provisioner gone before it finished", Progress{Proc: driver.Proc{PID: 10}}, false, nil, driver.Lost},
		{"provisioning failed", Progress{Proc: driver.Proc{PID: 10}, Done: true, RC: 1}, false, nil, driver.Lost},
		{"container gone", Progress{Proc: driver.Proc{PID: 10}, Done: true}, false, nil, driver.Lost},
		{"container stopped (docker kill)", Progress{Proc: driver.Proc{PID: 10}, Done: true}, false, stopped, driver.Lost},
		{"container restarting", Progress{Proc: driver.Proc{PID: 10}, Done: true}, false, restarting, driver.Starting},
		{"container runs", Progress{Proc: driver.Proc{PID: 10}, Done: true}, false, running, driver.Running},
	} {
		got, reason := Phase(c.p, c.alive, c.c)
		if got != c.want || (got == driver.Lost) != (reason != "") {
			t.Errorf("%s: %s %q, want %s (with a reason when Lost)", c.name, got, reason, c.want)
		}
	}
}

// TestProgressAndTerminateOfAFailedVM: the driver reads a VM's progress
// from its directory; a VM whose provisioning failed is Lost with the
// log's last line, Provision does not start it again, and Terminate
// removes its directory (kind and docker are stand-ins that only succeed:
// the e2e test TestKindTenant runs the real ones).
func TestProgressAndTerminateOfAFailedVM(t *testing.T) {
	bin := t.TempDir()
	for _, n := range []string{"kind", "docker"} {
		if err := os.WriteFile(filepath.Join(bin, n), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d := &Driver{Root: t.TempDir(), Kind: filepath.Join(bin, "kind"), Docker: filepath.Join(bin, "docker")}
	vm := driver.VM{ID: "uid-1", CPUMillis: 1000, MemoryMiB: 1024}
	ctx := context.Background()
	if s, err := d.Status(ctx, vm); err != nil || s.State != driver.Absent {
		t.Fatalf("before: %+v, %v", s, err)
	}
	dir := filepath.Join(d.Root, vm.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for f, v := range map[string]string{filePID: "999999999\n", fileRC: "1\n", fileLog: "Creating cluster ...\nERROR: failed to create cluster: no room\n"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := d.Status(ctx, vm)
	if err != nil || s.State != driver.Lost || !strings.Contains(s.Reason, "exit status 1") || !strings.Contains(s.Reason, "no room") {
		t.Fatalf("failed VM: %+v, %v", s, err)
	}
	if _, err := d.Provision(ctx, vm); !errors.Is(err, driver.ErrLost) {
		t.Fatalf("Provision of a failed VM: %v, want ErrLost", err)
	}
	if _, err := d.Credential(ctx, vm); err == nil {
		t.Error("a failed VM has a credential")
	}
	if err := d.Terminate(ctx, vm); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the VM's directory is left: %v", err)
	}
	if err := d.Terminate(ctx, vm); err != nil {
		t.Errorf("a second Terminate: %v", err)
	}
	if _, err := d.Provision(ctx, driver.VM{ID: "../escape", CPUMillis: 1000, MemoryMiB: 1024}); err == nil {
		t.Error("a VM id with a path was accepted")
	}
}

// fakeTools writes stand-ins for kind and docker into a directory: kind
// create stays alive (a provisioning that takes its time), every other
// call succeeds; docker info reports 4 CPUs and 8 GiB.
func fakeTools(t *testing.T) (kindBin, dockerBin string) {
	t.Helper()
	bin := t.TempDir()
	kindBin, dockerBin = filepath.Join(bin, "kind"), filepath.Join(bin, "docker")
	for p, s := range map[string]string{
		kindBin:   "#!/bin/sh\n[ \"$1\" = create ] && exec sleep 60\nexit 0\n",
		dockerBin: "#!/bin/sh\n[ \"$1\" = info ] && echo 4 8589934592\nexit 0\n",
	} {
		if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return kindBin, dockerBin
}

// TestTerminateSparesAReusedPID: a VM whose create.pid names another
// process (the PID was reused after a reboot or a crash) is not that
// process: Terminate kills neither it nor its process group, and Status
// reports the provisioning cut short (Lost), not Starting forever. Both
// with a create.pid of this driver (PID, start time, boot ID) and with a
// bare PID (an older driver's).
func TestTerminateSparesAReusedPID(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		pid  func(pid int) string
	}{
		{"another process's PID", func(pid int) string {
			return fmt.Sprintf("%d 1 00000000-0000-0000-0000-000000000000\n", pid)
		}},
		{"a bare PID (an older create.pid)", func(pid int) string { return fmt.Sprintf("%d\n", pid) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kindBin, dockerBin := fakeTools(t)
			d := &Driver{Root: t.TempDir(), Kind: kindBin, Docker: dockerBin}
			vm := driver.VM{ID: "uid-reused", CPUMillis: 1000, MemoryMiB: 1024}
			sleep := exec.Command("sleep", "60")
			sleep.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := sleep.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
			dir := filepath.Join(d.Root, vm.ID)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, filePID), []byte(tc.pid(sleep.Process.Pid)), 0o600); err != nil {
				t.Fatal(err)
			}
			if s, err := d.Status(ctx, vm); err != nil || s.State != driver.Lost {
				t.Errorf("Status: %+v, %v; want Lost", s, err)
			}
			if err := d.Terminate(ctx, vm); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { _ = sleep.Wait(); close(done) }()
			select {
			case <-done:
				t.Fatal("Terminate killed a process that is not the VM's")
			case <-time.After(500 * time.Millisecond):
			}
		})
	}
}

// TestAdoptAndTerminateAProvisioningVM: the provisioner the driver started
// is recorded with its start time, is found alive by a driver of an agent
// that started again (Starting, not started twice), and Terminate kills it
// and its process group.
func TestAdoptAndTerminateAProvisioningVM(t *testing.T) {
	kindBin, dockerBin := fakeTools(t)
	d := &Driver{Root: t.TempDir(), Kind: kindBin, Docker: dockerBin}
	vm := driver.VM{ID: "uid-live", CPUMillis: 1000, MemoryMiB: 1024}
	ctx := context.Background()
	if s, err := d.Provision(ctx, vm); err != nil || s.State != driver.Starting {
		t.Fatalf("Provision: %+v, %v", s, err)
	}
	dir := filepath.Join(d.Root, vm.ID)
	p, err := readProgress(dir)
	if err != nil || p.Proc.Start == 0 || p.Proc.Boot == "" {
		t.Fatalf("create.pid: %+v, %v", p, err)
	}
	pgid, err := syscall.Getpgid(p.Proc.PID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	d2 := &Driver{Root: d.Root, Kind: kindBin, Docker: dockerBin}
	if s, err := d2.Provision(ctx, vm); err != nil || s.State != driver.Starting {
		t.Fatalf("Provision after a restart: %+v, %v", s, err)
	}
	if q, _ := readProgress(dir); q.Proc != p.Proc {
		t.Fatalf("a second provisioner was started: %+v, was %+v", q.Proc, p.Proc)
	}
	if err := d2.Terminate(ctx, vm); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.Proc.Alive() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if p.Proc.Alive() {
		t.Error("the provisioner still runs")
	}
	for groupRuns(pgid) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if groupRuns(pgid) {
		t.Error("the provisioner's process group still runs")
	}
}

// groupRuns reports whether a process of group pgid runs (zombies that
// init has not reaped yet do not).
func groupRuns(pgid int) bool {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		i := strings.LastIndexByte(string(b), ')')
		if err != nil || i < 0 {
			continue
		}
		// state ppid pgrp ...
		if fs := strings.Fields(string(b[i+1:])); len(fs) > 2 && fs[2] == strconv.Itoa(pgid) && fs[0] != "Z" && fs[0] != "X" {
			return true
		}
	}
	return false
}

// TestConfigWithWebhook: with a webhook folder the node mounts it
// read-only at WebhookDir and its API server authenticates bearer tokens
// with the webhook configuration there (kubeadm v1beta4 arguments, which
// kind merges into its own).
func TestConfigWithWebhook(t *testing.T) {
	vm := driver.VM{ID: "uid-1", CPUMillis: 1500, MemoryMiB: 2048}
	b, err := Config(vm, "10.0.0.7", Capacity{CPUs: 4, MemoryBytes: 8 << 30}, "/var/lib/vms/uid-1/webhook")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Nodes []struct {
			Role        string
			ExtraMounts []struct {
				HostPath      string `json:"hostPath"`
				ContainerPath string `json:"containerPath"`
				ReadOnly      bool   `json:"readOnly"`
			} `json:"extraMounts"`
		}
		KubeadmConfigPatches []string `json:"kubeadmConfigPatches"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Nodes) != 1 || len(cfg.Nodes[0].ExtraMounts) != 1 || cfg.Nodes[0].ExtraMounts[0].HostPath != "/var/lib/vms/uid-1/webhook" ||
		cfg.Nodes[0].ExtraMounts[0].ContainerPath != WebhookDir || !cfg.Nodes[0].ExtraMounts[0].ReadOnly || len(cfg.KubeadmConfigPatches) != 2 {
		t.Fatalf("config:\n%s", b)
	}
	var api struct {
		Kind      string
		APIServer struct {
			ExtraArgs    []struct{ Name, Value string } `json:"extraArgs"`
			ExtraVolumes []struct {
				HostPath  string `json:"hostPath"`
				MountPath string `json:"mountPath"`
				ReadOnly  bool   `json:"readOnly"`
			} `json:"extraVolumes"`
		} `json:"apiServer"`
	}
	if err := yaml.Unmarshal([]byte(cfg.KubeadmConfigPatches[1]), &api); err != nil {
		t.Fatal(err)
	}
	args := map[string]string{}
	for _, a := range api.APIServer.ExtraArgs {
		args[a.Name] = a.Value
	}
	if api.Kind != "ClusterConfiguration" || args["authentication-token-webhook-config-file"] != WebhookDir+"/webhook.kubeconfig" ||
		args["authentication-token-webhook-version"] != "v1" || args["authentication-token-webhook-cache-ttl"] != "10s" ||
		len(api.APIServer.ExtraVolumes) != 1 || api.APIServer.ExtraVolumes[0].HostPath != WebhookDir || !api.APIServer.ExtraVolumes[0].ReadOnly {
		t.Fatalf("API server patch:\n%s", cfg.KubeadmConfigPatches[1])
	}
}
