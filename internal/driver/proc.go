package driver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Proc names one process across restarts of the agent: its PID, its
// start time (field 22 of /proc/<pid>/stat, in clock ticks since boot)
// and the boot ID of the machine it started on. A PID alone does not: after
// the process ends, and after a reboot, the same number names another
// process (the agent itself, dockerd, sshd), which a driver must never
// signal. A Proc without a start time or boot ID (what an older driver
// recorded: a bare PID) names no process a driver started: it is never
// Alive and never signalled.
type Proc struct {
	PID   int
	Start uint64 `json:",omitempty"`
	Boot  string `json:",omitempty"`
}

// ErrNotOurs is returned for a signal to a Proc that is gone (its PID is
// free or names another process).
var ErrNotOurs = errors.New("the process is gone")

// Started names the process pid: a driver calls it right after it started
// the process, and records what it returns with the PID.
func Started(pid int) (Proc, error) {
	start, err := startTime(pid)
	if err != nil {
		return Proc{}, err
	}
	boot, err := bootID()
	if err != nil {
		return Proc{}, err
	}
	return Proc{PID: pid, Start: start, Boot: boot}, nil
}

// Alive reports whether p runs: its PID names a live process (not a
// zombie) with p's start time, on the machine's current boot.
func (p Proc) Alive() bool {
	if p.PID <= 0 || p.Start == 0 || p.Boot == "" {
		return false
	}
	if boot, err := bootID(); err != nil || boot != p.Boot {
		return false
	}
	if start, err := startTime(p.PID); err != nil || start != p.Start {
		return false
	}
	return Alive(p.PID)
}

// Signal sends sig to p, if p is Alive: the process is held by a pidfd
// while its start time is checked, so the signal reaches it or nothing
// (never a process that took its PID in between).
func (p Proc) Signal(sig syscall.Signal) error {
	if p.PID <= 0 {
		return ErrNotOurs
	}
	fd, err := unix.PidfdOpen(p.PID, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return ErrNotOurs
	case err != nil:
		// No pidfd here (a kernel before 5.3: ENOSYS; a seccomp profile
		// that refuses pidfd_open, as Docker's before 20.10: EPERM):
		// checked, then signalled by PID.
		if !p.Alive() {
			return ErrNotOurs
		}
		return syscall.Kill(p.PID, sig)
	}
	defer unix.Close(fd)
	if !p.Alive() {
		return ErrNotOurs
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return ErrNotOurs
		}
		return fmt.Errorf("signalling the VM's process %d: %w", p.PID, err)
	}
	return nil
}

// Group returns the process group of p, if p is Alive and the group is
// neither init's nor the caller's own.
func (p Proc) Group() (int, bool) {
	if !p.Alive() {
		return 0, false
	}
	pgid, err := syscall.Getpgid(p.PID)
	if err != nil || pgid <= 1 || pgid == syscall.Getpgrp() || !p.Alive() {
		return 0, false
	}
	return pgid, true
}

// startTime is field 22 of /proc/<pid>/stat.
func startTime(pid int) (uint64, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("invalid PID %d", pid)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ...: comm may hold spaces and ')', the fields
	// from the state (field 3) on follow the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return strconv.ParseUint(f[22-3], 10, 64)
}

func bootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", errors.New("no boot ID")
	}
	return id, nil
}
