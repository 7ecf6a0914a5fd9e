package driver

import (
	"syscall"
	"testing"
)

// TestProcAlive: a Proc is Alive only with its PID's start time on the
// current boot; a bare PID (an older record) is never Alive nor signalled.
func TestProcAlive(t *testing.T) {
	p, err := Started(syscall.Getpid())
	if err != nil || p.Start == 0 || p.Boot == "" {
		t.Fatalf("Started: %+v, %v", p, err)
	}
	if !p.Alive() {
		t.Error("this process is not Alive")
	}
	for name, q := range map[string]Proc{
		"another start time": {PID: p.PID, Start: p.Start + 1, Boot: p.Boot},
		"another boot":       {PID: p.PID, Start: p.Start, Boot: "00000000-0000-0000-0000-000000000000"},
		"a bare PID":         {PID: p.PID},
		"no PID":             {},
	} {
		if q.Alive() {
			t.Errorf("%s: Alive", name)
		}
		if err := q.Signal(0); err == nil {
			t.Errorf("%s: signalled", name)
		}
		if _, ok := q.Group(); ok {
			t.Errorf("%s: has a group", name)
		}
	}
	if err := p.Signal(0); err != nil {
		t.Errorf("Signal 0 to this process: %v", err)
	}
	if _, ok := p.Group(); ok {
		t.Error("Group of the caller's own group")
	}
}
