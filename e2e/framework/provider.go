package framework

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Build builds cmd/<name> into dir and returns the binary's path.
func Build(ctx context.Context, repoRoot, dir, name string) (string, error) {
	out := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-ldflags", LDFlags(ctx, repoRoot), "-o", out, "./cmd/"+name)
	cmd.Dir = repoRoot
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", name, err, b)
	}
	return out, nil
}

// LDFlags stamps the work tree's commit (and "-dirty" for uncommitted
// changes) into a knotless binary, as make build does.
func LDFlags(ctx context.Context, repoRoot string) string {
	cmd := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty", "--abbrev=12")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	commit := strings.TrimSpace(string(out))
	if err != nil || commit == "" {
		commit = "unknown"
	}
	return "-X github.com/knotless-dev/knotless/cmd/internal/buildinfo.Commit=" + commit
}

// Provider is a running knotless-provider.
type Provider struct {
	*Process
	Bin        string
	Kubeconfig string
	Workspace  string
	ProbePort  int
	MetricPort int
	PprofPort  int
	// Args are extra flags.
	Args []string
	dir  string
}

// StartProvider starts the provider for the provider workspace ws and
// waits until its health endpoint answers (bootstrap done, manager
// started).
func StartProvider(ctx context.Context, g *Group, bin, dir, kubeconfig, ws string, args ...string) (*Provider, error) {
	p := &Provider{Bin: bin, Kubeconfig: kubeconfig, Workspace: ws, Args: args, dir: dir}
	return p, p.Restart(ctx, g)
}

// Restart starts the provider again with the same flags (after Kill9 or
// Stop).
func (p *Provider) Restart(ctx context.Context, g *Group) error {
	var err error
	if p.ProbePort, err = FreePort(); err != nil {
		return err
	}
	if p.MetricPort, err = FreePort(); err != nil {
		return err
	}
	if p.PprofPort, err = FreePort(); err != nil {
		return err
	}
	proc, err := Start(p.dir, "knotless-provider", p.Bin, append([]string{
		"--pprof-bind-address", "127.0.0.1:" + strconv.Itoa(p.PprofPort),
		"--kubeconfig", p.Kubeconfig,
		"--workspace", p.Workspace,
		"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(p.ProbePort),
		"--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(p.MetricPort),
	}, p.Args...), nil)
	if err != nil {
		return err
	}
	g.Add(proc)
	p.Process = proc
	return Eventually(ctx, 3*time.Minute, "knotless-provider to be healthy", func(ctx context.Context) (bool, string, error) {
		if proc.Exited() {
			return false, "", fmt.Errorf("knotless-provider exited: %w\n%s", ErrExited, proc.Tail(20))
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", p.ProbePort))
		if err != nil {
			return false, err.Error(), nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	})
}

// Metrics returns the provider's Prometheus text.
func (p *Provider) Metrics() (string, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.MetricPort))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Profile writes one of the provider's pprof profiles to path: "heap?gc=1"
// (the heap after a garbage collection) or "goroutine?debug=1" (goroutines
// grouped by stack, as text).
func (p *Provider) Profile(profile, path string) error {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/%s", p.PprofPort, profile))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s profile: %s", profile, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// CPU returns the CPU time (user and system) the process has used.
func (p *Process) CPU() (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID()))
	if err != nil {
		return 0, err
	}
	// Fields after the command (which may hold spaces) start after ')'.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", p.PID())
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	// Clock ticks of 1/100 s (USER_HZ on Linux).
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// RSS returns the resident set size of the process in bytes.
func (p *Process) RSS() (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", p.PID()))
	if err != nil {
		return 0, err
	}
	var size, resident int64
	if _, err := fmt.Sscan(string(raw), &size, &resident); err != nil {
		return 0, err
	}
	return resident * int64(os.Getpagesize()), nil
}

// MetricSum is the sum of every series of the metric name in Prometheus
// text (0 when there is none).
func MetricSum(text, name string) float64 {
	total := 0.0
	for _, line := range strings.Split(text, "\n") {
		if line == name || strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return total
}
