// Package process is the process driver of knotless-agent: each VM is a
// tenant apiserver process (`kcp start` of the pinned kcp) on the agent's
// machine, with its own data directory, CA and free ports, started in a
// session of its own so that it outlives a restart of the agent. What the
// driver knows of a VM is in its directory (<root>/<VM ID>): the ports,
// the process (its ID, start time and boot ID: driver.Proc) and the mount
// identity's token, so that an agent that starts again adopts a VM that
// runs and reports one whose process died as Lost. A PID that now names
// another process (reused after a reboot or a crash) is not the VM's: it is
// Lost and that process is never signalled; so is a VM whose state file
// has a bare PID (written by an older driver, without the start time).
package process

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/statesync"
)

// MountUser is the tenant user the mount's credential authenticates as.
const MountUser = "knotless-mount"

// Driver runs VMs as kcp processes.
type Driver struct {
	// Root holds one directory per VM.
	Root string
	// KCP is the kcp binary.
	KCP string
	// Host is the address the tenant apiservers listen on (default
	// 127.0.0.1).
	Host string
	// Webhook is where the tenants ask who a bearer token is (the agent's
	// service-auth webhook); without it a tenant accepts no service-auth
	// token.
	Webhook *driver.Webhook
}

var _ driver.Driver = (*Driver)(nil)

// state is what the driver keeps of a VM, in <dir>/vm.json.
type state struct {
	Port, EtcdClient, EtcdPeer int
	// The VM's kcp process (its PID, start time and boot ID).
	driver.Proc
	Token string
	// ServiceID is the audience of the service-auth tokens the VM's
	// tenant accepts through the agent's webhook ("" when it was started
	// without it).
	ServiceID string `json:",omitempty"`
}

func (d *Driver) dir(vm driver.VM) (string, error) {
	if vm.ID == "" || strings.ContainsAny(vm.ID, `/\.`) {
		return "", fmt.Errorf("process driver: invalid VM id %q", vm.ID)
	}
	return filepath.Join(d.Root, vm.ID), nil
}

func (d *Driver) host() string {
	if d.Host == "" {
		return "127.0.0.1"
	}
	return d.Host
}

func load(dir string) (*state, error) {
	b, err := os.ReadFile(filepath.Join(dir, "vm.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("process driver: %s: %w", dir, err)
	}
	adoptBarePID(dir, &st)
	return &st, nil
}

// adoptBarePID names the process of a state file an older driver wrote
// (a bare PID) once more, when that PID runs this VM's own kcp (its
// command line is `kcp start ... --root-directory <dir>/kcp ...`, which
// no other process has): its start time and boot ID are recorded, so that
// an agent upgraded under running VMs adopts them (R03) while a PID taken
// by another process stays not ours.
func adoptBarePID(dir string, st *state) {
	if st.PID <= 0 || (st.Start != 0 && st.Boot != "") {
		return
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", st.PID))
	if err != nil {
		return
	}
	args := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	i := slices.Index(args, "--root-directory")
	if i < 1 || i+1 >= len(args) || !slices.Contains(args[:i], "start") || args[i+1] != filepath.Join(dir, "kcp") {
		return
	}
	p, err := driver.Started(st.PID)
	if err != nil {
		return
	}
	st.Proc = p
	_ = save(dir, st)
}

func save(dir string, st *state) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "vm.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "vm.json"))
}

// Provision implements driver.Driver.
func (d *Driver) Provision(ctx context.Context, vm driver.VM) (driver.Status, error) {
	dir, err := d.dir(vm)
	if err != nil {
		return driver.Status{}, err
	}
	st, err := load(dir)
	if err != nil {
		return driver.Status{}, err
	}
	if st != nil {
		s, err := d.status(ctx, dir, st, vm)
		if err == nil && s.State == driver.Lost {
			return s, driver.ErrLost
		}
		return s, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return driver.Status{}, err
	}
	st = &state{}
	ports, err := freePorts(d.host(), 3)
	if err != nil {
		return driver.Status{}, err
	}
	st.Port, st.EtcdClient, st.EtcdPeer = ports[0], ports[1], ports[2]
	tok := make([]byte, 24)
	if _, err := rand.Read(tok); err != nil {
		return driver.Status{}, err
	}
	st.Token = hex.EncodeToString(tok)
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(fmt.Sprintf("%s,%s,%s,\"knotless\"\n", st.Token, MountUser, MountUser)), 0o600); err != nil {
		return driver.Status{}, err
	}
	// A shell starts kcp in the background and exits: kcp belongs to
	// init from then on (which reaps it), in a session of its own, so it
	// outlives this call and the agent. The shell prints its PID.
	args := []string{"start",
		"--root-directory", filepath.Join(dir, "kcp"),
		"--bind-address", d.host(),
		"--secure-port", strconv.Itoa(st.Port),
		"--embedded-etcd-client-port", strconv.Itoa(st.EtcdClient),
		"--embedded-etcd-peer-port", strconv.Itoa(st.EtcdPeer),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		// Nobody gets a workspace of their own on a tenant: an
		// authenticated user would be its admin there.
		"--enable-home-workspaces=false",
	}
	if d.Webhook != nil && vm.ServiceID != "" {
		cfg, err := d.Webhook.Kubeconfig(vm.ID)
		if err != nil {
			return driver.Status{}, err
		}
		if err := os.WriteFile(filepath.Join(dir, "webhook.kubeconfig"), cfg, 0o600); err != nil {
			return driver.Status{}, err
		}
		st.ServiceID = vm.ServiceID
		args = append(args, "--authentication-token-webhook-config-file", filepath.Join(dir, "webhook.kubeconfig"),
			"--authentication-token-webhook-version", "v1",
			"--authentication-token-webhook-cache-ttl", driver.WebhookCacheTTL.String())
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", `"$0" "$@" >>kcp.log 2>&1 </dev/null & echo $!`, d.KCP}, args...)...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.Output()
	if err != nil {
		return driver.Status{}, fmt.Errorf("process driver: starting kcp: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return driver.Status{}, fmt.Errorf("process driver: starting kcp: no PID (%q)", out)
	}
	// Its start time, read now, tells it from a process that takes its
	// PID later. When it cannot be read kcp has already ended: the bare
	// PID recorded names no process of the VM's, which is Lost.
	if st.Proc, err = driver.Started(pid); err != nil {
		st.Proc = driver.Proc{PID: pid}
	}
	if err := save(dir, st); err != nil {
		_ = st.Signal(syscall.SIGKILL)
		return driver.Status{}, err
	}
	return driver.Status{State: driver.Starting}, nil
}

// Status implements driver.Driver.
func (d *Driver) Status(ctx context.Context, vm driver.VM) (driver.Status, error) {
	dir, err := d.dir(vm)
	if err != nil {
		return driver.Status{}, err
	}
	st, err := load(dir)
	if err != nil || st == nil {
		return driver.Status{State: driver.Absent}, err
	}
	return d.status(ctx, dir, st, vm)
}

func (d *Driver) status(ctx context.Context, dir string, st *state, vm driver.VM) (driver.Status, error) {
	if !st.Alive() {
		return driver.Status{State: driver.Lost, Reason: fmt.Sprintf("the VM's process %d is gone", st.PID)}, nil
	}
	cfg, err := d.admin(dir)
	if err != nil {
		return driver.Status{State: driver.Starting}, nil
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return driver.Status{State: driver.Starting}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.base(st)+"/readyz", nil)
	if err != nil {
		return driver.Status{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return driver.Status{State: driver.Starting}, nil
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return driver.Status{State: driver.Starting}, nil
	}
	if err := driver.Grant(ctx, cfg, vm, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: "User", Name: MountUser}); err != nil {
		return driver.Status{State: driver.Starting, Reason: err.Error()}, nil
	}
	ca, err := os.ReadFile(filepath.Join(dir, "kcp", "apiserver.crt"))
	if err != nil {
		return driver.Status{}, err
	}
	return driver.Status{State: driver.Running, Endpoint: d.base(st) + "/clusters/root", CA: ca, ServiceID: st.ServiceID}, nil
}

func (d *Driver) base(st *state) string {
	return "https://" + net.JoinHostPort(d.host(), strconv.Itoa(st.Port))
}

// admin is the tenant's admin config, from the kubeconfig kcp wrote.
func (d *Driver) admin(dir string) (*rest.Config, error) {
	return clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kcp", "admin.kubeconfig"))
}

// AccessDIDs implements driver.Driver.
func (d *Driver) AccessDIDs(ctx context.Context, vm driver.VM) ([]string, error) {
	dir, err := d.dir(vm)
	if err != nil {
		return nil, err
	}
	cfg, err := d.admin(dir)
	if err != nil {
		return nil, err
	}
	return driver.AccessDIDs(ctx, cfg)
}

// Credential implements driver.Driver.
func (d *Driver) Credential(_ context.Context, vm driver.VM) (string, error) {
	dir, err := d.dir(vm)
	if err != nil {
		return "", err
	}
	st, err := load(dir)
	if err != nil {
		return "", err
	}
	if st == nil {
		return "", errors.New("process driver: the VM does not exist")
	}
	return st.Token, nil
}

// Terminate implements driver.Driver: SIGTERM, then SIGKILL after 30 s,
// to the VM's process only while it is Alive (a reused PID is left
// alone); the VM's directory goes.
func (d *Driver) Terminate(ctx context.Context, vm driver.VM) error {
	dir, err := d.dir(vm)
	if err != nil {
		return err
	}
	st, err := load(dir)
	if err != nil {
		return err
	}
	if st != nil && st.Alive() {
		_ = st.Signal(syscall.SIGTERM)
		// A stopped process gets its SIGTERM only once it runs again
		// (a tenant that stopped answering may be one).
		_ = st.Signal(syscall.SIGCONT)
		deadline := time.Now().Add(30 * time.Second)
		for st.Alive() && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
		_ = st.Signal(syscall.SIGKILL)
		for end := time.Now().Add(5 * time.Second); st.Alive() && time.Now().Before(end); {
			time.Sleep(100 * time.Millisecond)
		}
		if st.Alive() {
			// Its folder stays while it runs: the next Terminate tries again.
			return fmt.Errorf("process driver: the VM's process %d did not stop", st.PID)
		}
	}
	return os.RemoveAll(dir)
}

// running is the admin config of a VM whose process runs.
func (d *Driver) running(vm driver.VM) (*rest.Config, error) {
	dir, err := d.dir(vm)
	if err != nil {
		return nil, err
	}
	st, err := load(dir)
	if err != nil {
		return nil, err
	}
	if st == nil || !st.Alive() {
		return nil, errors.New("process driver: the VM does not run")
	}
	return d.admin(dir)
}

// Export implements driver.Driver, as the tenant's admin.
func (d *Driver) Export(ctx context.Context, vm driver.VM, resources []schema.GroupResource) ([]byte, int, error) {
	cfg, err := d.running(vm)
	if err != nil {
		return nil, 0, err
	}
	return statesync.Export(ctx, cfg, resources)
}

// Import implements driver.Driver, as the tenant's admin.
func (d *Driver) Import(ctx context.Context, vm driver.VM, snapshot []byte, allowed []schema.GroupResource) (int, error) {
	cfg, err := d.running(vm)
	if err != nil {
		return 0, err
	}
	return statesync.Import(ctx, cfg, snapshot, allowed)
}

// PIDs returns the process IDs of the VMs under root (for a test's
// clean-up).
func PIDs(root string) []int {
	entries, _ := os.ReadDir(root)
	var out []int
	for _, e := range entries {
		if st, err := load(filepath.Join(root, e.Name())); err == nil && st != nil {
			out = append(out, st.PID)
		}
	}
	return out
}

// PIDOf returns the process ID of the VM id under root (0 when it has
// none), for a test.
func PIDOf(root, id string) int {
	st, err := load(filepath.Join(root, id))
	if err != nil || st == nil {
		return 0
	}
	return st.PID
}

// freePorts returns n distinct TCP ports on host that were free a moment
// ago. Their listeners stay open until all n are chosen: one closed
// before the next is picked may be given again, and a kcp given the same
// port twice does not start.
func freePorts(host string, n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
