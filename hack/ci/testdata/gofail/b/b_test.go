package b

import "testing"

func TestValidate(t *testing.T) { t.Fatal("b: spec.url is empty") }
