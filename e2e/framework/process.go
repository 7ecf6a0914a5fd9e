// Package framework starts the real parts of an e2e run (kcp, the
// provider) and offers fixtures for workspaces. Every process it starts is
// killed by PID when the run ends, also when it fails, and its log file's
// tail is printed on failure.
package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a child process whose output goes to a log file.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	logFile *os.File
}

// Start runs bin with args, logging to dir/<name>.log (appending, so a
// restarted process keeps its history in one file).
func Start(dir, name, bin string, args []string, env []string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "\n==== %s: %s %s\n", time.Now().Format(time.RFC3339), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Own process group, so Kill reaches children too; and die with us.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{}), logFile: f}
	go func() {
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// PID returns the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill9 sends SIGKILL to the process group and waits for the exit.
func (p *Process) Kill9() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// DumpGoroutines sends SIGQUIT to a Go process: it writes every
// goroutine's stack to its log and exits. For diagnosing a hang.
func (p *Process) DumpGoroutines() {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.Kill9()
	}
}

// Stop sends SIGTERM, waits up to grace, then SIGKILL.
func (p *Process) Stop(grace time.Duration) {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill9()
	}
}

// Wait waits for the exit and returns its error.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.waitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string { return TailFile(p.LogPath, n) }

// TailFile returns the last n lines of a file.
func TailFile(path string, n int) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := bytes.Split(bytes.TrimRight(raw, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	// The kernel may give a port it gave before once its listener is
	// closed: a provider got the same port for its metrics and its health
	// probe, and did not start. A port is handed out once per test binary.
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port, nil
		}
	}
	return 0, errors.New("no free port that was not handed out before")
}

// handedOut is every port FreePort returned.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// Group tracks processes so that one call stops them all.
type Group struct {
	mu    sync.Mutex
	procs []*Process
}

// Add tracks p.
func (g *Group) Add(p *Process) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.procs = append(g.procs, p)
}

// StopAll stops every tracked process, newest first.
func (g *Group) StopAll() {
	g.mu.Lock()
	procs := append([]*Process(nil), g.procs...)
	g.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(10 * time.Second)
	}
}

// Tails returns the last n lines of every tracked process's log, once per
// log file.
func (g *Group) Tails(n int) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var b strings.Builder
	seen := map[string]bool{}
	for _, p := range g.procs {
		if seen[p.LogPath] {
			continue
		}
		seen[p.LogPath] = true
		fmt.Fprintf(&b, "\n----- last %d lines of %s (%s) -----\n%s\n", n, p.Name, p.LogPath, p.Tail(n))
	}
	return b.String()
}

// ErrExited is returned when a process ends while it is waited for.
var ErrExited = errors.New("process exited")
