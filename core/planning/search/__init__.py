"""Which deployment to buy: the SLO search (`slo`, `plan_slo`), its inputs and candidates (`slo_candidates`;
the search space's input fields: `search_fields`), one
candidate evaluated (`slo_eval`) and disaggregated candidates (`slo_disagg`). Imports every planning layer below it."""
