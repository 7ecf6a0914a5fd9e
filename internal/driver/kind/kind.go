// Package kind is the kind driver of knotless-agent: each VM is a
// single-node Kubernetes cluster made by the pinned kind from the node
// image (make node-image), in a docker container of its own on a docker
// network of its own. The container is held to the VM's shape (docker's
// CPU quota and memory limit) and its kubelet reserves the rest of the
// machine, so the node's allocatable is the shape; the API server listens
// on the agent's tenant host.
//
// Provisioning (kind create cluster, docker update, kind load of the
// preloaded images) runs as a shell of its own, started in a session of
// its own, so it outlives the agent: an agent that starts again finds it
// running, or finished, and adopts the cluster. What the driver knows of
// a VM is in its directory (<root>/<VM ID>): kind's configuration, the
// script and its log, the provisioner's process (create.pid: its ID, start
// time and boot ID, driver.Proc) and exit status (create.rc), and the
// cluster's admin kubeconfig. A VM whose provisioning failed, or whose node
// container stopped or is gone, is Lost and never made again. A create.pid
// whose PID now names another process (reused after a reboot or a crash)
// is not the provisioner: it is gone and that process is never signalled;
// so is a bare PID (an older driver's create.pid, or an agent that died
// between starting the provisioner and recording its start time).
package kind

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/statesync"
)

// The mount identity on a kind tenant: a ServiceAccount whose only rights
// are driver.ImpersonationRules, and the Secret its token is issued in.
const (
	MountNamespace      = "kube-system"
	MountServiceAccount = "knotless-mount"
	MountTokenSecret    = "knotless-mount-token"
)

// Files of a VM's directory.
const (
	fileConfig     = "kind.yaml"
	fileScript     = "create.sh"
	fileLog        = "create.log"
	filePID        = "create.pid"
	fileRC         = "create.rc"
	fileKubeconfig = "kubeconfig"
	// The service-auth webhook: the folder the node mounts (its
	// webhook.kubeconfig), the address the agent serves it at for the VM
	// (on the VM network's gateway), and the VM's service identity.
	dirWebhook    = "webhook"
	fileWebhookAt = "webhook.addr"
	fileServiceID = "service-id"
)

// Driver runs VMs as kind clusters.
type Driver struct {
	// Root holds one directory per VM.
	Root string
	// Kind is the kind binary (the pinned kind v0.33.0).
	Kind string
	// Image is the node image (make node-image prints it).
	Image string
	// Host is the address the tenants' API servers listen on (default
	// 127.0.0.1).
	Host string
	// Docker is the docker binary (default: docker in PATH).
	Docker string
	// PathPrefix, when set, is put first in the PATH of kind and docker
	// (hack/node-image/docker-runtime.sh prints the folder of the docker
	// shim that machines which cannot grant every capability need).
	PathPrefix string
	// Preload are images (in the agent's docker) loaded into every new
	// VM before it is Running: nodes that cannot pull run them.
	Preload []string
	// Webhook is where the tenants ask who a bearer token is (the agent's
	// service-auth webhook, which serves each VM on its docker network's
	// gateway: Webhook.ListenFor); without it a tenant accepts no
	// service-auth token.
	Webhook *driver.Webhook

	mu sync.Mutex
	// serving are the webhook's listeners, by VM id.
	serving map[string]io.Closer
}

var _ driver.Driver = (*Driver)(nil)

func (d *Driver) dir(vm driver.VM) (string, error) {
	if vm.ID == "" || strings.ContainsAny(vm.ID, `/\.`) {
		return "", fmt.Errorf("kind driver: invalid VM id %q", vm.ID)
	}
	return filepath.Join(d.Root, vm.ID), nil
}

func (d *Driver) host() string {
	if d.Host == "" {
		return "127.0.0.1"
	}
	return d.Host
}

func (d *Driver) docker() string {
	if d.Docker == "" {
		return "docker"
	}
	return d.Docker
}

// env is the environment of kind and docker: the PATH prefix, and the
// VM's own docker network (kind makes it when it is missing).
func (d *Driver) env(cluster string) []string {
	env := os.Environ()
	if d.PathPrefix != "" {
		env = append(env, "PATH="+d.PathPrefix+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	return append(env, "KIND_EXPERIMENTAL_DOCKER_NETWORK="+cluster)
}

func (d *Driver) run(ctx context.Context, cluster, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = d.env(cluster)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", filepath.Base(name), args[0], err, strings.TrimSpace(lastLine(stderr.String())))
	}
	return out, nil
}

// capacity is the docker host's CPUs and memory.
func (d *Driver) capacity(ctx context.Context) (Capacity, error) {
	out, err := d.run(ctx, "", d.docker(), "info", "--format", "{{.NCPU}} {{.MemTotal}}")
	if err != nil {
		return Capacity{}, err
	}
	var c Capacity
	if _, err := fmt.Sscan(string(out), &c.CPUs, &c.MemoryBytes); err != nil || c.CPUs <= 0 || c.MemoryBytes <= 0 {
		return Capacity{}, fmt.Errorf("kind driver: docker info says %q", out)
	}
	return c, nil
}

// Provision implements driver.Driver.
func (d *Driver) Provision(ctx context.Context, vm driver.VM) (driver.Status, error) {
	dir, err := d.dir(vm)
	if err != nil {
		return driver.Status{}, err
	}
	if _, err := os.Stat(filepath.Join(dir, filePID)); err == nil {
		s, err := d.status(ctx, dir, vm)
		if err == nil && s.State == driver.Lost {
			return s, driver.ErrLost
		}
		return s, err
	}
	c, err := d.capacity(ctx)
	if err != nil {
		return driver.Status{}, err
	}
	if _, _, err := Reserved(vm, c); err != nil {
		return driver.Status{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return driver.Status{}, err
	}
	webhookDir, err := d.webhook(ctx, dir, vm)
	if err != nil {
		return driver.Status{}, err
	}
	cfg, err := Config(vm, d.host(), c, webhookDir)
	if err != nil {
		return driver.Status{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, fileConfig), cfg, 0o600); err != nil {
		return driver.Status{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, fileScript), []byte(Script(d.Kind, d.docker(), d.Image, vm, d.Preload)), 0o600); err != nil {
		return driver.Status{}, err
	}
	// A shell starts the script in the background, writes its PID and
	// exits: the script belongs to init from then on, in a session of its
	// own, so it outlives this call and the agent; it writes its exit
	// status when it ends.
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", `(sh create.sh >>create.log 2>&1 </dev/null; echo $? >create.rc.tmp; mv create.rc.tmp create.rc) >/dev/null 2>&1 </dev/null & echo $! >create.pid.tmp && mv create.pid.tmp create.pid`)
	cmd.Dir = dir
	cmd.Env = d.env(ClusterName(vm.ID))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if out, err := cmd.CombinedOutput(); err != nil {
		return driver.Status{}, fmt.Errorf("kind driver: starting the provisioner: %w: %s", err, out)
	}
	if err := recordStart(dir); err != nil {
		return driver.Status{}, err
	}
	return driver.Status{State: driver.Starting}, nil
}

// recordStart adds to create.pid the start time and boot ID of the
// provisioner, read right after it started. When they cannot be read the
// provisioner has already ended and create.pid keeps its bare PID, which
// names no process of the VM's.
func recordStart(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, filePID))
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("kind driver: starting the provisioner: no PID (%q)", b)
	}
	proc, err := driver.Started(pid)
	if err != nil {
		return nil
	}
	tmp := filepath.Join(dir, filePID+".tmp")
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%d %d %s\n", proc.PID, proc.Start, proc.Boot)), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, filePID))
}

// webhook prepares the service-auth webhook of a VM that has a service
// identity, when the agent serves one: it makes the VM's docker network
// (kind takes one that exists), writes the node's webhook configuration
// (the webhook at the network's gateway, on the agent's webhook port)
// into dir/webhook, which it returns ("" for none), and starts serving
// the webhook there for the VM.
func (d *Driver) webhook(ctx context.Context, dir string, vm driver.VM) (string, error) {
	if d.Webhook == nil || d.Webhook.ListenFor == nil || vm.ServiceID == "" {
		return "", nil
	}
	cluster := ClusterName(vm.ID)
	if _, err := d.run(ctx, cluster, d.docker(), "network", "create", "--driver", "bridge", cluster); err != nil && !strings.Contains(err.Error(), "already exists") {
		return "", fmt.Errorf("kind driver: %w", err)
	}
	out, err := d.run(ctx, cluster, d.docker(), "network", "inspect", "--format", "{{range .IPAM.Config}}{{.Gateway}} {{end}}", cluster)
	if err != nil {
		return "", fmt.Errorf("kind driver: %w", err)
	}
	gateway := ""
	for _, f := range strings.Fields(string(out)) {
		if ip := net.ParseIP(f); ip != nil && ip.To4() != nil {
			gateway = f
			break
		}
	}
	u, err := url.Parse(d.Webhook.URL)
	if gateway == "" || err != nil || u.Port() == "" {
		return "", fmt.Errorf("kind driver: no IPv4 gateway of the VM's network (%q) or no webhook port", strings.TrimSpace(string(out)))
	}
	addr := net.JoinHostPort(gateway, u.Port())
	kc, err := d.Webhook.KubeconfigAt(vm.ID, addr)
	if err != nil {
		return "", err
	}
	wd := filepath.Join(dir, dirWebhook)
	if err := os.MkdirAll(wd, 0o700); err != nil {
		return "", err
	}
	for name, b := range map[string][]byte{filepath.Join(wd, "webhook.kubeconfig"): kc, filepath.Join(dir, fileWebhookAt): []byte(addr), filepath.Join(dir, fileServiceID): []byte(vm.ServiceID)} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			return "", err
		}
	}
	if _, err := d.serveWebhook(dir, vm); err != nil {
		return "", err
	}
	return wd, nil
}

// serveWebhook makes sure the agent serves the webhook for a VM that
// was provisioned with one (after the agent starts again too), and
// returns the VM's service identity ("" for a VM without).
func (d *Driver) serveWebhook(dir string, vm driver.VM) (string, error) {
	id, err := os.ReadFile(filepath.Join(dir, fileServiceID))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	addr, err := os.ReadFile(filepath.Join(dir, fileWebhookAt))
	if err != nil {
		return "", err
	}
	if d.Webhook == nil || d.Webhook.ListenFor == nil {
		return "", errors.New("kind driver: the VM's tenant authenticates with the agent's webhook, which this agent does not serve")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.serving[vm.ID] == nil {
		ln, err := d.Webhook.ListenFor(vm.ID, string(addr))
		if err != nil {
			return "", fmt.Errorf("kind driver: serving the webhook for the VM: %w", err)
		}
		if d.serving == nil {
			d.serving = map[string]io.Closer{}
		}
		d.serving[vm.ID] = ln
	}
	return string(id), nil
}

// stopWebhook stops serving the webhook for the VM id.
func (d *Driver) stopWebhook(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.serving[id]; c != nil {
		_ = c.Close()
		delete(d.serving, id)
	}
}

// Status implements driver.Driver.
func (d *Driver) Status(ctx context.Context, vm driver.VM) (driver.Status, error) {
	dir, err := d.dir(vm)
	if err != nil {
		return driver.Status{}, err
	}
	if _, err := os.Stat(filepath.Join(dir, filePID)); errors.Is(err, os.ErrNotExist) {
		return driver.Status{State: driver.Absent}, nil
	}
	return d.status(ctx, dir, vm)
}

// Progress is where a VM's provisioning stands, from its directory.
type Progress struct {
	// Proc is the provisioner (PID 0: none recorded; no start time: a
	// bare PID, which names no process of the VM's).
	Proc driver.Proc
	// Done: the provisioner wrote its exit status, RC.
	Done bool
	RC   int
}

// readProgress reads dir's create.pid and create.rc.
func readProgress(dir string) (Progress, error) {
	var p Progress
	b, err := os.ReadFile(filepath.Join(dir, filePID))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return p, err
	}
	p.Proc = parseProc(string(b))
	b, err = os.ReadFile(filepath.Join(dir, fileRC))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return p, err
	default:
		p.Done = true
		if p.RC, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			p.RC = -1
		}
	}
	return p, nil
}

// parseProc reads create.pid: "PID START BOOT", or a bare PID.
func parseProc(s string) driver.Proc {
	f := strings.Fields(s)
	var p driver.Proc
	if len(f) == 0 {
		return p
	}
	p.PID, _ = strconv.Atoi(f[0])
	if len(f) == 3 {
		p.Start, _ = strconv.ParseUint(f[1], 10, 64)
		p.Boot = f[2]
	}
	return p
}

// container is what docker says of a node container.
type container struct {
	State struct {
		Running, Paused, Restarting bool
		Status                      string
		ExitCode                    int
	}
	HostConfig struct {
		NanoCpus, Memory int64
	}
}

// inspect returns the node container of cluster, nil when it is gone.
func (d *Driver) inspect(ctx context.Context, cluster string) (*container, error) {
	out, err := d.run(ctx, cluster, d.docker(), "container", "inspect", NodeName(cluster))
	if err != nil {
		if strings.Contains(err.Error(), "No such") {
			return nil, nil
		}
		return nil, err
	}
	var cs []container
	if err := json.Unmarshal(out, &cs); err != nil || len(cs) != 1 {
		return nil, fmt.Errorf("kind driver: docker inspect of the node: %q", out)
	}
	return &cs[0], nil
}

// Phase maps what the driver reads of a VM (its provisioning, its node
// container) to the VM's state before its API server is asked: Starting
// while it is provisioned or its container is paused or restarting,
// Lost when provisioning failed or was cut short or the container
// stopped or is gone, Running when the API server is to be asked.
func Phase(p Progress, provisionerAlive bool, c *container) (driver.State, string) {
	switch {
	case !p.Done && provisionerAlive:
		return driver.Starting, ""
	case !p.Done:
		return driver.Lost, "the VM's provisioning was cut short (its provisioner is gone)"
	case p.RC != 0:
		return driver.Lost, fmt.Sprintf("provisioning the VM failed (exit status %d)", p.RC)
	case c == nil:
		return driver.Lost, "the VM's node container is gone"
	case c.State.Restarting || c.State.Paused:
		return driver.Starting, ""
	case !c.State.Running:
		return driver.Lost, fmt.Sprintf("the VM's node container stopped (%s, exit code %d)", c.State.Status, c.State.ExitCode)
	}
	return driver.Running, ""
}

func (d *Driver) status(ctx context.Context, dir string, vm driver.VM) (driver.Status, error) {
	p, err := readProgress(dir)
	if err != nil {
		return driver.Status{}, err
	}
	alive := p.Proc.Alive()
	if !alive && !p.Done {
		// It may have ended between the two reads.
		if p, err = readProgress(dir); err != nil {
			return driver.Status{}, err
		}
	}
	cluster := ClusterName(vm.ID)
	var c *container
	if p.Done && p.RC == 0 {
		if c, err = d.inspect(ctx, cluster); err != nil {
			return driver.Status{}, err
		}
	}
	state, reason := Phase(p, alive, c)
	if state == driver.Lost && p.Done && p.RC != 0 {
		if tail := lastLine(readTail(filepath.Join(dir, fileLog))); tail != "" {
			reason += ": " + tail
		}
	}
	if state != driver.Running {
		return driver.Status{State: state, Reason: reason}, nil
	}
	cfg, err := admin(dir)
	if err != nil {
		return driver.Status{State: driver.Starting, Reason: err.Error()}, nil
	}
	if err := ready(ctx, cfg); err != nil {
		return driver.Status{State: driver.Starting, Reason: err.Error()}, nil
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return driver.Status{}, err
	}
	alloc, err := nodeAllocatable(ctx, cs)
	if err != nil {
		return driver.Status{State: driver.Starting, Reason: err.Error()}, nil
	}
	if err := d.grant(ctx, cfg, cs, vm); err != nil {
		return driver.Status{State: driver.Starting, Reason: err.Error()}, nil
	}
	serviceID, err := d.serveWebhook(dir, vm)
	if err != nil {
		return driver.Status{State: driver.Starting, Reason: err.Error()}, nil
	}
	alloc.LimitCPUMillis, alloc.LimitMemoryMiB = c.HostConfig.NanoCpus/1_000_000, c.HostConfig.Memory>>20
	return driver.Status{State: driver.Running, Endpoint: cfg.Host, CA: cfg.CAData, Enforced: alloc, ServiceID: serviceID}, nil
}

// admin is the tenant's admin config, from the kubeconfig kind wrote.
func admin(dir string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, fileKubeconfig))
	if err != nil {
		return nil, fmt.Errorf("kind driver: the VM's kubeconfig: %w", err)
	}
	if len(cfg.CAData) == 0 {
		return nil, errors.New("kind driver: the VM's kubeconfig has no CA")
	}
	return cfg, nil
}

// ready asks the API server's /readyz.
func ready(ctx context.Context, cfg *rest.Config) error {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return errors.New("the VM's API server does not answer yet")
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the VM's API server is not ready (%d)", resp.StatusCode)
	}
	return nil
}

// nodeAllocatable is the allocatable of the cluster's node, once it is
// Ready.
func nodeAllocatable(ctx context.Context, cs kubernetes.Interface) (*driver.Enforced, error) {
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	if len(nodes.Items) != 1 {
		return nil, fmt.Errorf("the VM has %d nodes, not 1", len(nodes.Items))
	}
	n := &nodes.Items[0]
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			return nil, errors.New("the VM's node is not Ready yet")
		}
	}
	a := n.Status.Allocatable
	return &driver.Enforced{AllocatableCPUMillis: a.Cpu().MilliValue(), AllocatableMemoryMiB: a.Memory().Value() >> 20}, nil
}

// grant makes the mount identity (a ServiceAccount with a token Secret)
// and applies the tenant's RBAC (driver.Grant).
func (d *Driver) grant(ctx context.Context, cfg *rest.Config, cs kubernetes.Interface, vm driver.VM) error {
	opts := metav1.ApplyOptions{FieldManager: driver.FieldManager, Force: true}
	if _, err := cs.CoreV1().ServiceAccounts(MountNamespace).Apply(ctx, corev1ac.ServiceAccount(MountServiceAccount, MountNamespace), opts); err != nil {
		return fmt.Errorf("the mount's ServiceAccount: %w", err)
	}
	sec := corev1ac.Secret(MountTokenSecret, MountNamespace).WithType(corev1.SecretTypeServiceAccountToken).
		WithAnnotations(map[string]string{corev1.ServiceAccountNameKey: MountServiceAccount})
	if _, err := cs.CoreV1().Secrets(MountNamespace).Apply(ctx, sec, opts); err != nil {
		return fmt.Errorf("the mount's token Secret: %w", err)
	}
	return driver.Grant(ctx, cfg, vm, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: MountServiceAccount, Namespace: MountNamespace})
}

// AccessDIDs implements driver.Driver.
func (d *Driver) AccessDIDs(ctx context.Context, vm driver.VM) ([]string, error) {
	cfg, err := d.running(vm)
	if err != nil {
		return nil, err
	}
	return driver.AccessDIDs(ctx, cfg)
}

// Credential implements driver.Driver: the mount ServiceAccount's token.
func (d *Driver) Credential(ctx context.Context, vm driver.VM) (string, error) {
	cfg, err := d.running(vm)
	if err != nil {
		return "", err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	sec, err := cs.CoreV1().Secrets(MountNamespace).Get(ctx, MountTokenSecret, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("kind driver: the mount's token: %w", err)
	}
	if len(sec.Data[corev1.ServiceAccountTokenKey]) == 0 {
		return "", errors.New("kind driver: the mount's token is not issued yet")
	}
	return string(sec.Data[corev1.ServiceAccountTokenKey]), nil
}

// TenantAdmin implements driver.Workloads.
func (d *Driver) TenantAdmin(_ context.Context, vm driver.VM) (*rest.Config, error) {
	return d.running(vm)
}

var _ driver.Workloads = (*Driver)(nil)

// running is the admin config of a VM that was provisioned.
func (d *Driver) running(vm driver.VM) (*rest.Config, error) {
	dir, err := d.dir(vm)
	if err != nil {
		return nil, err
	}
	if p, err := readProgress(dir); err != nil || !p.Done || p.RC != 0 {
		return nil, errors.New("kind driver: the VM does not run")
	}
	return admin(dir)
}

// Terminate implements driver.Driver: the provisioner (if it still runs,
// and is the process the driver started) is killed with its process
// group, kind deletes the cluster's node with its volumes, docker
// removes the VM's network, and the VM's directory goes.
func (d *Driver) Terminate(ctx context.Context, vm driver.VM) error {
	dir, err := d.dir(vm)
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	p, err := readProgress(dir)
	if err != nil {
		return err
	}
	// Only a provisioner that is still the one the driver started (a
	// reused PID is another process, whose group is left alone).
	if !p.Done {
		if pgid, ok := p.Proc.Group(); ok {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
		_ = p.Proc.Signal(syscall.SIGKILL)
	}
	d.stopWebhook(vm.ID)
	cluster := ClusterName(vm.ID)
	if _, err := d.run(ctx, cluster, d.Kind, "delete", "cluster", "--name", cluster, "--kubeconfig", filepath.Join(dir, fileKubeconfig)); err != nil {
		return fmt.Errorf("kind driver: %w", err)
	}
	if _, err := d.run(ctx, cluster, d.docker(), "network", "rm", cluster); err != nil && !strings.Contains(err.Error(), "No such network") && !strings.Contains(err.Error(), "not found") {
		return fmt.Errorf("kind driver: %w", err)
	}
	return os.RemoveAll(dir)
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

// VMs are the IDs of the VMs under root that were provisioned (for a
// test's clean-up).
func VMs(root string) []string {
	entries, _ := os.ReadDir(root)
	var out []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(root, e.Name(), filePID)); err == nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// readTail is the end (at most 4 KiB) of a file.
func readTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > 4096 {
		_, _ = f.Seek(-4096, 2)
	}
	b := make([]byte, 4096)
	n, _ := f.Read(b)
	return string(b[:n])
}

// lastLine is the last non-empty line of s, cut (conditions.Quote).
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return conditions.Quote(strings.TrimSpace(lines[len(lines)-1]))
}
