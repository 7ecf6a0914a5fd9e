// Package ci tests .ci/steps.sh, the step helpers of .ci/run.
package ci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runSteps runs script after sourcing .ci/steps.sh in a scratch folder, as
// .ci/run does, and returns its output and exit code. Every process it
// starts is killed when it ends (its process group), also the background
// steps a failed join leaves running.
func runSteps(t *testing.T, script string) (string, int) {
	t.Helper()
	steps, err := filepath.Abs("../../.ci/steps.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail; start=$(date +%s); source "+steps+"\n"+script)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A file, not a pipe: a background step left running holds its copy
	// of the output open, and reading a pipe would wait for it.
	logFile, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	err = cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	out, rerr := os.ReadFile(logFile.Name())
	if rerr != nil {
		t.Fatal(rerr)
	}
	if ctx.Err() != nil {
		t.Fatalf("the script did not end within a minute:\n%s", out)
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// TestTableNamesEveryStep: the table at the end has a row per step, in the
// foreground or the background, with its seconds, its CPU seconds and the
// machine's busy percent, and a total.
func TestTableNamesEveryStep(t *testing.T) {
	out, code := runSteps(t, `
bg quiet sleep 1
bg other true
join quiet other
step "spin" awk 'BEGIN { for (i = 0; i < 1e8; i++) s += i }'
`)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, row := range []string{`quiet \(background\)\s+\d+\s+0\s+\d+%`, `other \(background\)\s+\d+\s+\d+\s+\d+%`, `spin\s+\d+\s+\d+\s+\d+%`, `total\s+\d+\s+\d+\s+\d+%`, `ci: done`} {
		if !regexp.MustCompile(row).MatchString(out) {
			t.Errorf("no row %q in:\n%s", row, out)
		}
	}
	// A loop of a few CPU seconds (however long it takes under load): the
	// step used CPU seconds of its own, and the machine was busy
	// meanwhile; sleeping used none (the row above).
	if m := regexp.MustCompile(`spin\s+\d+\s+(\d+)\s+(\d+)%`).FindStringSubmatch(out); m == nil || m[1] == "0" || m[2] == "0" {
		t.Errorf("the spinning step's CPU seconds and busy percent: %v in:\n%s", m, out)
	}
}

// TestJoinStopsAtTheFirstFailure: a background step that fails ends the
// run with its exit code and its log's tail, without waiting for the
// steps still running beside it (here one that would never end), and the
// table is printed.
func TestJoinStopsAtTheFirstFailure(t *testing.T) {
	out, code := runSteps(t, `
bg forever sleep 1000
bg broken bash -c 'echo the tool did not build; exit 3'
join forever broken
echo not reached
`)
	if code != 3 {
		t.Errorf("exit %d, want the failed step's 3:\n%s", code, out)
	}
	for _, want := range []string{"ci: broken failed (exit 3):", "the tool did not build", "broken (background)", "ci: failed (exit 3)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not reached") {
		t.Errorf("the run went on after a failed join:\n%s", out)
	}
}

// TestFailedTestsSayWhy: when make test fails, the end of the output names
// each failed test, package by package, with the last messages it wrote
// (a subtest's under it, its parent's after the subtests too, a parallel
// test's), and on a timeout the tests still running with theirs; not the
// tests that passed, not the goroutine dump. The logs in testdata are go
// test's own output (go1.26) for one test file of two packages, with and
// without -v, and of a run that timed out.
func TestFailedTestsSayWhy(t *testing.T) {
	table := `--- FAIL: TestTable (0.00s)
    a_test.go:11: the parent before its subtests
    a_test.go:15: the parent after its subtests
    --- FAIL: TestTable/one (0.00s)
        a_test.go:13: case one: want 2, got 3
    --- FAIL: TestTable/two (0.00s)
        a_test.go:13: case two: want 2, got 3
--- FAIL: TestValidate (0.00s)
    a_test.go:18: a: the object has been modified
--- FAIL: TestLast (0.00s)
    a_test.go:22: the node image was not built
FAIL	example.com/gofail/a	%s
--- FAIL: TestValidate (0.00s)
    b_test.go:5: b: spec.url is empty
FAIL	example.com/gofail/b	%s
`
	for _, c := range []struct{ logs, want string }{
		{"gotest.log", fmt.Sprintf(table, "0.036s", "0.018s")},
		{"gotest-v.log", fmt.Sprintf(table, "0.024s", "0.017s")},
		{"gotest.log gotest-timeout.log", fmt.Sprintf(table, "0.036s", "0.018s") + `--- FAIL: TestValidate (0.00s)
    a_test.go:18: a: the object has been modified
panic: test timed out after 3s
	running tests:
		TestHangs (3s)
		    a_test.go:30: waiting for the contract
FAIL	example.com/gofail/a	3.027s
`},
	} {
		testdata, err := filepath.Abs("testdata")
		if err != nil {
			t.Fatal(err)
		}
		out, code := runSteps(t, "(cd "+testdata+" && cat "+c.logs+") >bin/ci-test.log\nfalse\n")
		if code != 1 {
			t.Errorf("%s: exit %d, want 1:\n%s", c.logs, code, out)
		}
		if want := "ci: failed tests (from bin/ci-test.log):\n" + c.want + "ci: step"; !strings.Contains(out, want) {
			t.Errorf("%s: want\n%s\nin:\n%s", c.logs, want, out)
		}
	}
}
