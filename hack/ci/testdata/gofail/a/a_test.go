package a

import (
	"testing"
	"time"
)

func TestPasses(t *testing.T) { t.Log("a figure of a test that passed") }

func TestTable(t *testing.T) {
	t.Log("the parent before its subtests")
	for _, c := range []string{"one", "two"} {
		t.Run(c, func(t *testing.T) { t.Errorf("case %s: want 2, got 3", c) })
	}
	t.Log("the parent after its subtests")
}

func TestValidate(t *testing.T) { t.Fatal("a: the object has been modified") }

func TestLast(t *testing.T) {
	t.Parallel()
	t.Log("the node image was not built")
	t.Fail()
}

func TestHangs(t *testing.T) {
	if testing.Short() {
		return
	}
	t.Log("waiting for the contract")
	time.Sleep(time.Hour)
}
