{{/* Names and labels. */}}
{{- define "runtimeproxy.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 30 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "runtimeproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "runtimeproxy.labels" -}}
{{ include "runtimeproxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "runtimeproxy.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The runtime-hooks DaemonSets: one per group, then the default one. Returns YAML {units: [...]},
each unit {name, suffix, policy, terms}: terms are the nodeSelectorTerms of its node affinity
(none: every node). Group i takes the nodes its selector matches and no earlier group's
selector does; the default takes the nodes no group's selector matches. NOT of a selector (an
AND of requirements) is the OR of the negated requirements, so each earlier group multiplies
the terms by its requirement count (the schema caps both).
*/}}
{{- define "runtimeproxy.units" -}}
{{- $units := list -}}
{{- $earlier := list -}}
{{- $names := dict -}}
{{- range .Values.groups -}}
{{- if hasKey $names .name -}}
{{- fail (printf "groups: the name %q is used twice; group names must be unique" .name) -}}
{{- end -}}
{{- $_ := set $names .name true -}}
{{- $own := include "runtimeproxy.requirements" .nodeSelector | fromYaml -}}
{{- $terms := include "runtimeproxy.excluding" (dict "terms" (list $own.r) "selectors" $earlier) | fromYaml -}}
{{- $units = append $units (dict "name" .name "suffix" (printf "-%s" .name) "policy" (.policy | default dict) "terms" $terms.terms) -}}
{{- $earlier = append $earlier $own.r -}}
{{- end -}}
{{- $default := dict "name" "default" "suffix" "" "policy" (.Values.policy | default dict) "terms" list -}}
{{- if $earlier -}}
{{- $terms := include "runtimeproxy.excluding" (dict "terms" (list list) "selectors" $earlier) | fromYaml -}}
{{- $_ := set $default "terms" $terms.terms -}}
{{- end -}}
{{- toYaml (dict "units" (append $units $default)) -}}
{{- end -}}

{{/* A LabelSelector's requirements as node selector requirements: {r: [...]}, matchLabels first. */}}
{{- define "runtimeproxy.requirements" -}}
{{- $reqs := list -}}
{{- range $key, $value := (.matchLabels | default dict) -}}
{{- $reqs = append $reqs (dict "key" $key "operator" "In" "values" (list (toString $value))) -}}
{{- end -}}
{{- range (.matchExpressions | default list) -}}
{{- $req := dict "key" .key "operator" .operator -}}
{{- if has .operator (list "In" "NotIn") -}}
{{- $_ := set $req "values" .values -}}
{{- end -}}
{{- $reqs = append $reqs $req -}}
{{- end -}}
{{- toYaml (dict "r" $reqs) -}}
{{- end -}}

{{/* {terms: [...]}: every term of .terms ANDed with the negation of every selector in .selectors. */}}
{{- define "runtimeproxy.excluding" -}}
{{- $negated := dict "In" "NotIn" "NotIn" "In" "Exists" "DoesNotExist" "DoesNotExist" "Exists" -}}
{{- $terms := .terms -}}
{{- range $selector := .selectors -}}
{{- $next := list -}}
{{- range $term := $terms -}}
{{- range $req := $selector -}}
{{- $not := dict "key" $req.key "operator" (get $negated $req.operator) -}}
{{- if hasKey $req "values" -}}
{{- $_ := set $not "values" $req.values -}}
{{- end -}}
{{- $next = append $next (append $term $not) -}}
{{- end -}}
{{- end -}}
{{- $terms = $next -}}
{{- end -}}
{{- toYaml (dict "terms" $terms) -}}
{{- end -}}

{{/* Whether a unit's policy shapes egress traffic ("true" or ""): a network.interface, and the
network plugin not left out by hooks.enable / hooks.disable. */}}
{{- define "runtimeproxy.networkOn" -}}
{{- $policy := .unit.policy -}}
{{- $interface := "" -}}
{{- if kindIs "map" (get $policy "network") -}}
{{- $interface = get (get $policy "network") "interface" | default "" -}}
{{- end -}}
{{- $hooks := .Values.hooks -}}
{{- $plugin := and (not (has "network" $hooks.disable)) (or (not $hooks.enable) (has "network" $hooks.enable)) -}}
{{- if and $interface $plugin -}}true{{- end -}}
{{- end -}}
