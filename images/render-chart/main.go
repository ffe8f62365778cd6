// render-chart renders a Helm chart the way `helm template` does, for
// machines where helm itself cannot be installed: Go's text/template with
// the sprig function library (what Helm uses) plus Helm's own include, tpl,
// required, toYaml, fromYaml and toJson, the .Values/.Release/.Chart/.Template
// objects, and Helm's treatment of missing values. It prints every rendered
// manifest of templates/ as one multi-document YAML stream with Helm's
// "# Source:" comments; NOTES.txt is rendered too (errors fail) but not
// printed, as helm template does.
//
// Usage: render-chart [-name RELEASE] [-namespace NS] [-values FILE]... CHART_DIR
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

type valueFiles []string

func (v *valueFiles) String() string     { return strings.Join(*v, ",") }
func (v *valueFiles) Set(s string) error { *v = append(*v, s); return nil }

func readYAML(path string) (map[string]interface{}, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// merge overlays b on a, recursively for maps (as helm -f does).
func merge(a, b map[string]interface{}) map[string]interface{} {
	for k, bv := range b {
		if bm, ok := bv.(map[string]interface{}); ok {
			if am, ok := a[k].(map[string]interface{}); ok {
				a[k] = merge(am, bm)
				continue
			}
		}
		a[k] = bv
	}
	return a
}

func toYAML(v interface{}) string {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

func main() {
	name := flag.String("name", "release-name", "release name")
	namespace := flag.String("namespace", "default", "release namespace")
	var extra valueFiles
	flag.Var(&extra, "values", "values file overlaid on the chart's values.yaml (repeatable)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: render-chart [-name RELEASE] [-namespace NS] [-values FILE]... CHART_DIR")
		os.Exit(2)
	}
	if err := render(flag.Arg(0), *name, *namespace, extra); err != nil {
		fmt.Fprintln(os.Stderr, "render-chart:", err)
		os.Exit(1)
	}
}

func render(dir, name, namespace string, extra []string) error {
	chart, err := readYAML(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return err
	}
	values, err := readYAML(filepath.Join(dir, "values.yaml"))
	if err != nil {
		return err
	}
	for _, f := range extra {
		v, err := readYAML(f)
		if err != nil {
			return err
		}
		values = merge(values, v)
	}
	chartName, _ := chart["name"].(string)
	if chartName == "" {
		return errors.New("Chart.yaml has no name")
	}
	files, err := filepath.Glob(filepath.Join(dir, "templates", "*"))
	if err != nil {
		return err
	}
	sort.Strings(files)

	root := template.New("chart").Option("missingkey=zero")
	funcs := sprig.TxtFuncMap()
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		_ = yaml.Unmarshal([]byte(s), &m)
		return m
	}
	funcs["toJson"] = func(v interface{}) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil || v == "" {
			return nil, errors.New(msg)
		}
		return v, nil
	}
	funcs["include"] = func(n string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := root.ExecuteTemplate(&buf, n, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = t.Execute(&buf, data)
		return buf.String(), err
	}
	root.Funcs(funcs)

	var names []string
	notes := "" // rendered as helm install does, to catch its errors, but not printed
	for _, f := range files {
		base := filepath.Base(f)
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		n := chartName + "/templates/" + base
		if _, err := root.New(n).Parse(string(data)); err != nil {
			return err
		}
		if base == "NOTES.txt" {
			notes = n
		} else if !strings.HasPrefix(base, "_") && (strings.HasSuffix(base, ".yaml") || strings.HasSuffix(base, ".yml")) {
			names = append(names, n)
		}
	}
	release := map[string]interface{}{
		"Name": name, "Namespace": namespace, "Service": "Helm",
		"IsInstall": true, "IsUpgrade": false, "Revision": 1,
	}
	chartObj := map[string]interface{}{
		"Name": chartName, "Version": chart["version"], "AppVersion": chart["appVersion"],
		"Description": chart["description"],
	}
	var out bytes.Buffer
	if notes != "" {
		names = append(names, notes)
	}
	for _, n := range names {
		top := map[string]interface{}{
			"Values": values, "Release": release, "Chart": chartObj,
			"Template":     map[string]interface{}{"Name": n, "BasePath": chartName + "/templates"},
			"Capabilities": map[string]interface{}{"KubeVersion": map[string]interface{}{"Version": "v1.30.0"}},
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, n, top); err != nil {
			return err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if n == notes || strings.TrimSpace(text) == "" {
			continue
		}
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", n, strings.TrimSpace(text))
	}
	_, err = os.Stdout.Write(out.Bytes())
	return err
}
